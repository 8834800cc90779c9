"""The Policy contract: everything generic code (engine, train, algos, deploy) may ask of a policy.

Generic code never names a family; it asks this class. A family subclasses `Policy`, calls its
constructor first (config, observation shapes, chunk shape, normalizers), builds its networks, and
implements `act`, `evaluate`, `value` and `sft_loss`. Checkpoints (`save_pretrained` /
`from_pretrained`) are the same folder for every family (policies/checkpoint.py). The hooks
`transformer_stacks` (memory estimate), `action_program` (export), `act_guided` (guided real-time
chunking, with its flag `can_guide_chunks`), `sample_reparameterized` (off-policy actor-critic) and
`act_from_noise` (noise-space RL, with its flag `can_act_from_noise`) have defaults that fit a family
without transformers, without an exportable action path, without guidable sampling, without a
reparameterized sampler and without an initial noise to steer. docs/architecture.md, "Contracts", shows
where each method is called.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from tensordict import TensorDict
from torch import nn

from embodrl.errors import UserError
from embodrl.policies.checkpoint import read_checkpoint, write_checkpoint
from embodrl.policies.config import PolicyConfig
from embodrl.policies.modules.mlp import ValueHead, mlp
from embodrl.policies.modules.obs_encoder import ObsEncoder, make_normalizers


@dataclass
class ActOut:
    """Result of `Policy.act` (no grad)."""

    actions: torch.Tensor  # [N, C, A] float32, in env units (un-normalized)
    logprob: torch.Tensor  # [N, ...] granularity given by the policy's logprob_type
    value: torch.Tensor  # [N]
    replay: TensorDict  # [N]: exactly what `evaluate` needs to recompute `logprob`


@dataclass
class EvalOut:
    """Result of `Policy.evaluate` (with grad)."""

    logprob: torch.Tensor  # same shape as ActOut.logprob
    entropy: torch.Tensor  # [N] (or broadcastable to logprob)
    value: torch.Tensor  # [N]


@dataclass
class ChunkGuidance:
    """What `Policy.act_guided` steers a new chunk toward (guided real-time chunking, Black et al. 2025).

    Row i of `prev_actions` is the previous chunk's action for the new chunk's step i, in env units;
    only the first `overlap` steps of each sample hold one (H - s in the paper). The first `delay` steps
    (d) will be executed from the previous chunk while the new one is computed, so they are matched
    hardest; `max_weight` is the guidance weight's cap (beta; 0 samples without guidance)."""

    prev_actions: torch.Tensor  # [N, C, A] float32, env units (rows at and beyond `overlap` ignored)
    overlap: torch.Tensor  # [N] int64 in [0, C]
    delay: torch.Tensor  # [N] int64 >= 0
    max_weight: float = 5.0


@dataclass(frozen=True)
class TransformerStack:
    """A stack of transformer layers and the tokens it sees per sample (for the activation estimate)."""

    tokens: int
    hidden: int
    intermediate: int
    layers: int


@dataclass(frozen=True)
class ProgramInput:
    """One input of an exported action program besides the observation keys: name, per-sample shape, dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32" | "int64" | "uint8"


class ActionProgram(nn.Module, ABC):
    """A policy's deterministic action path as a fixed tensor program (what `embodrl export` traces).

    Inputs: the policy's `obs_keys` in order as plain tensors, then `extra_inputs`. Output: actions
    [N, C, A] float32 in env units (normalization inside). Holds the actor's modules only."""

    extra_inputs: tuple[ProgramInput, ...] = ()

    def __init__(self, policy: Policy, encoder: ObsEncoder) -> None:
        super().__init__()
        self.obs_keys, self.encoder, self.normalizers = policy.cfg.obs_keys, encoder, policy.normalizers

    @abstractmethod
    def normalized_actions(self, features: torch.Tensor, extra: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Observation features [N, F] (and the extra inputs) -> normalized actions [N, C, A]."""

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        count = len(self.obs_keys)
        features = self.encoder.encode(dict(zip(self.obs_keys, inputs[:count], strict=True)))  # [N, F]
        return self.normalizers["action"].unnormalize(self.normalized_actions(features, inputs[count:]))


def no_noise_input(family: str) -> UserError:
    """The error for a policy whose actions are not a function of an initial noise (`act_from_noise`)."""
    return UserError(
        f"a {family} policy does not act from a given initial noise, which noise-space RL "
        "(algo.noise_policy) steers; give it a flow policy's checkpoint (policy.family=flow)"
    )


def not_exportable(what: str) -> UserError:
    """The error of `Policy.action_program` for a policy that decodes over a VLA backbone."""
    return UserError(
        f"a {what} policy cannot be exported (it decodes over a VLA backbone with text prompts); "
        "exportable families: gaussian, flow (flow.conditioning=mlp). Serve it with "
        "`embodrl serve CHECKPOINT` instead"
    )


class Policy(nn.Module, ABC):
    """A policy family behind one interface; generic code never branches on the family.

    Observations are TensorDicts [N] with the keys of embodrl/obs_keys.py. A language policy reads its
    instruction from `obs["instruction"]` (N strings) when present, as a served policy receives it,
    and otherwise looks it up from `obs["task_id"]` in the env's instruction table, which
    `set_instruction_table` gives it.
    """

    family: ClassVar[str]  # its name in policies/registry.py, written into every checkpoint
    can_guide_chunks: ClassVar[bool] = False  # whether `act_guided` works (deploy's chunk.mode=guided_rtc)
    can_act_from_noise: ClassVar[bool] = False  # whether `act_from_noise` works (noise-space RL, DSRL)

    def __init__(
        self, cfg: PolicyConfig, obs_shapes: Mapping[str, tuple[int, ...]], device: str = "cpu"
    ) -> None:
        """What every family holds: its config, the per-env observation shapes it was built for, the
        action chunk shape [C, A] and the normalizers saved with it. A family moves itself to `device`
        once its networks are built."""
        super().__init__()
        self.cfg, self.obs_shapes = cfg, dict(obs_shapes)
        self.chunk_shape = (cfg.chunk_size, cfg.action_dim)
        self.normalizers = make_normalizers(cfg, self.obs_shapes)

    # -- acting and learning -----------------------------------------------------------------------

    @abstractmethod
    def act(self, obs: TensorDict, deterministic: bool = False) -> ActOut: ...

    @abstractmethod
    def evaluate(self, obs: TensorDict, replay: TensorDict) -> EvalOut: ...

    @abstractmethod
    def value(self, obs: TensorDict) -> torch.Tensor:
        """V(s) [N], used to bootstrap truncated episodes."""

    @abstractmethod
    def sft_loss(self, batch: TensorDict) -> torch.Tensor:
        """Behaviour-cloning loss on a batch with observation keys and `action` [B, C, A]."""

    def act_guided(self, obs: TensorDict, guidance: ChunkGuidance) -> torch.Tensor:
        """Deterministic action chunks [N, C, A] (env units) that continue `guidance.prev_actions`
        (guided real-time chunking); only families with `can_guide_chunks` implement it."""
        raise UserError(
            f"a {self.family} policy cannot steer its chunks toward the previous one (guided real-time "
            "chunking needs a flow policy); use chunk.mode=rtc, its guidance-free cross-fade"
        )

    @property
    def noise_shape(self) -> tuple[int, int]:
        """Per-sample shape [H, D] of the initial noise `act_from_noise` starts from (the model's chunk,
        which may be padded beyond `chunk_shape`)."""
        raise no_noise_input(self.family)

    def act_from_noise(self, obs: TensorDict, noise: torch.Tensor) -> torch.Tensor:
        """Action chunks [N, C, A] (env units, no grad) that the deterministic sampler makes from the given
        initial noise [N, *noise_shape] instead of a random one: what noise-space RL (DSRL, Wagenmaker et
        al. 2025) steers a frozen policy through. Only families with `can_act_from_noise` implement it."""
        raise no_noise_input(self.family)

    @property
    def can_sample_reparameterized(self) -> bool:
        """Whether `sample_reparameterized` works (what off-policy algorithms check before they start)."""
        return False

    def frozen_features(self, obs: TensorDict) -> TensorDict | None:
        """{camera key: features [N, ...]} of the policy's image encoders when none of them trains (a frozen
        pretrained tower), else None. An off-policy learner stores them in its replay buffer in place of
        the images and hands them back to `sample_reparameterized`: computed once per observation."""
        return None

    def sample_reparameterized(
        self, obs: TensorDict, image_features: TensorDict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Action chunks [N, C, A] in env units, drawn as a differentiable function of the actor's weights
        (the reparameterization trick), and their log-prob [N] (normalized units, summed over the chunk):
        what an off-policy actor-critic (SAC) maximizes Q - alpha * log-prob through. `image_features`
        (from `frozen_features`) stand in for the cameras, whose entries in `obs` are then not read. Only
        families with a tractable density of bounded actions implement it."""
        raise UserError(
            f"a {self.family} policy has no reparameterized sampler, which off-policy algorithms train "
            "through; use policy.family=gaussian with policy.gaussian.squash=tanh"
        )

    def critic_parameters(self) -> list[nn.Parameter]:
        """Parameters trained by the value loss alone (critic learning rate): the modules named
        `critic` and `value_encoder`; everything else is the actor's."""
        return [p for name, p in self.named_parameters() if name.startswith(("critic.", "value_encoder."))]

    # -- data the policy is told -------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.normalizers["action"].mean.device

    def set_normalization(self, stats: Mapping[str, Mapping]) -> None:
        """Set stats per key ("state", "privileged", "action": {mean, std, q01, q99}); others are ignored."""
        for key, key_stats in stats.items():
            if key in self.normalizers:
                self.normalizers[key].set_stats(key_stats)

    def adopt_run_settings(self) -> None:
        """Build what the family's RUN_SETTINGS in `self.cfg` ask for and the weights lack (a module a run
        adds to a loaded checkpoint); called by prepare_finetuning. Nothing by default."""

    def set_instruction_table(self, instructions: Sequence[str]) -> None:
        """The env's instruction table (policy.vla.instructions), through which a language policy reads its
        prompt by obs["task_id"]; an imported checkpoint comes without one."""
        self.cfg = self.cfg.with_instruction_table(instructions)

    # -- hooks for memory estimation and export ----------------------------------------------------

    def transformer_stacks(self) -> list[tuple[str, TransformerStack]]:
        """The transformer stacks a training step runs, in forward order, each with its parameter group
        ("vision", "language", "action_head"; policies/lora.py); none for a policy without transformers."""
        return []

    def action_program(self) -> ActionProgram:
        """The deterministic action path as a traceable program; raises a UserError when it is not one."""
        raise not_exportable(self.family)

    # -- checkpoints -------------------------------------------------------------------------------

    def save_pretrained(self, directory: str | Path) -> None:
        """Write config.json, model.safetensors and normalization.safetensors into `directory`."""
        write_checkpoint(directory, self.family, self.cfg, self.obs_shapes, self.state_dict())

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str = "cpu") -> Policy:
        """Rebuild the policy saved in `directory` on `device`."""
        cfg, obs_shapes, state = read_checkpoint(directory, cls.family, device)
        policy = cls(cfg, obs_shapes, device=device)
        policy.load_state_dict(state)
        return policy

    # -- building blocks the families share --------------------------------------------------------

    def _make_value_encoder(self) -> ObsEncoder | None:
        """The critic's own encoder when `policy.value_obs_keys` is set (e.g. privileged state), else None."""
        if not self.cfg.value_obs_keys:
            return None
        return ObsEncoder(self.cfg, self.cfg.value_obs_keys, self.obs_shapes, self.normalizers)

    def _make_critic(self, actor_feature_dim: int) -> ValueHead:
        """V(s) on the value encoder's features, or on the actor's when the critic has no encoder (build
        `value_encoder` first)."""
        in_dim = self.value_encoder.out_dim if self.value_encoder is not None else actor_feature_dim
        return ValueHead(in_dim, self.cfg.value_hidden_dims)

    def _make_aux_head(self, actor_feature_dim: int) -> nn.Module | None:
        """The head that regresses `policy.sft_aux_keys` from the actor's features in SFT, or None."""
        keys = self.cfg.sft_aux_keys
        if not keys:
            return None
        missing = [k for k in keys if k not in self.obs_shapes]
        if missing:
            raise UserError(
                f"policy.sft_aux_keys lists {missing}, which the env does not observe "
                f"({sorted(self.obs_shapes)}); drop them or pick an env that observes them"
            )
        out_dim = sum(self.obs_shapes[k][-1] for k in keys)
        return mlp(actor_feature_dim, (256,), out_dim, activation="silu")

    def _aux_loss(self, batch: TensorDict, features: torch.Tensor) -> torch.Tensor:
        """`policy.sft_aux_weight` x the MSE between the auxiliary head on the actor's `features` [B, F]
        and the batch's normalized `policy.sft_aux_keys`; 0 without a head or at weight 0."""
        keys, weight = self.cfg.sft_aux_keys, self.cfg.sft_aux_weight
        if self.aux_head is None or weight == 0:
            return features.new_zeros(())
        missing = [k for k in keys if k not in batch.keys()]
        if missing:
            raise UserError(
                f"the SFT batch lacks {missing} that policy.sft_aux_keys regresses; present: "
                f"{sorted(batch.keys())}"
            )
        target = torch.cat([self.normalizers[k](batch[k].float()) for k in keys], dim=-1)
        return weight * (self.aux_head(features.float()) - target).pow(2).mean()

    def _critic_inputs_absent(self, obs: TensorDict) -> bool:
        """Whether `obs` lacks a key that only the critic reads: a served policy on a robot, which observes
        no privileged simulator state. act() then gives NaN values instead of failing; training never
        meets it (build_policy checks that the env observes every key)."""
        return self.value_encoder is not None and any(k not in obs.keys() for k in self.cfg.value_obs_keys)

    def _value(self, obs: TensorDict, features: torch.Tensor | None) -> torch.Tensor:
        """V(s) [N] from the actor's `features`, or from the value encoder (then `features` may be None);
        NaN where the critic's own inputs are absent (see `_critic_inputs_absent`)."""
        if self._critic_inputs_absent(obs):
            return torch.full(obs.batch_size[:1], float("nan"), device=self.device)
        return self.critic(features if self.value_encoder is None else self.value_encoder(obs))
