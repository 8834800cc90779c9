"""Flow-matching policy: a velocity MLP or pi0's action expert over a VLA, and its RL likelihood heads.

Training (openpi): t ~ Beta(1.5, 1) * 0.999 + 0.001, x_t = t * noise + (1 - t) * action, and the
net regresses v = noise - action. Sampling integrates K Euler steps from t = 1 (noise) to t = 0 in
normalized action units. The likelihood head (`flow.likelihood`) makes the chain stochastic for RL:
Flow-Noise (flow_noise.py) or Flow-SDE (flow_sde.py). Deterministic `act` runs the plain ODE (no
step noise) from x_0 ~ N(0, I), as in pi0 inference; `act_from_noise` runs it from a given x_0 (DSRL).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch import nn

from embodrl.errors import ConfigError, UserError
from embodrl.policies.base import (
    ActionProgram,
    ActOut,
    ChunkGuidance,
    EvalOut,
    ProgramInput,
    TransformerStack,
    not_exportable,
)
from embodrl.policies.config import PolicyConfig
from embodrl.policies.flow.action_expert import ActionExpert, expert_shape
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.flow.flow_noise import FlowNoiseHead
from embodrl.policies.flow.flow_sde import FlowSDEHead
from embodrl.policies.flow.guidance import guided_euler_sample, prefix_weights
from embodrl.policies.flow.sampling import VelocityFn, euler_sample
from embodrl.policies.flow.vla_flow import PrefixCache, VLAFlowPrefix
from embodrl.policies.modules.logprob import reduce_logprob
from embodrl.policies.modules.mlp import mlp
from embodrl.policies.modules.obs_encoder import ObsEncoder, add_state_noise
from embodrl.policies.modules.sft import check_action_batch, masked_mean, zero_padded_steps
from embodrl.policies.modules.time_features import time_features
from embodrl.policies.vla.prefix import VLAPolicy


class VelocityNet(nn.Module):
    """v(features [N, F], x_t [N, C, A], t [N]) -> [N, C, A]: an MLP on [features, x_t, time features]."""

    def __init__(self, feature_dim: int, chunk_shape: tuple[int, int], cfg: FlowConfig) -> None:
        super().__init__()
        self.chunk_shape, self.num_frequencies = chunk_shape, cfg.num_time_frequencies
        in_dim = feature_dim + math.prod(chunk_shape) + 2 * cfg.num_time_frequencies
        self.net = mlp(in_dim, cfg.hidden_dims, math.prod(chunk_shape), activation="silu")

    def forward(self, features: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        inputs = torch.cat([features, x.flatten(1), time_features(t, self.num_frequencies)], dim=-1)
        return self.net(inputs).view(-1, *self.chunk_shape)


class FlowODEProgram(ActionProgram):
    """K Euler steps of the velocity MLP from the noise `x0` [N, C, A]: the plain ODE that
    `act(deterministic=True)` runs (zeros give a chunk that depends on the observation alone)."""

    def __init__(self, policy: FlowPolicy) -> None:
        super().__init__(policy, policy.encoder)
        self.velocity_net, self.num_steps = policy.velocity_net, policy.cfg.flow.num_steps
        self.extra_inputs = (ProgramInput("x0", policy.chunk_shape, "float32"),)

    def normalized_actions(self, features: torch.Tensor, extra: tuple[torch.Tensor, ...]) -> torch.Tensor:
        (x0,) = extra
        return euler_sample(lambda x, t: self.velocity_net(features, x, t), x0, self.num_steps)


class FlowPolicy(VLAPolicy):
    """Flow-matching actor-critic; replay stores the denoising chain (and Flow-SDE's step index).

    `flow.conditioning` picks the velocity model: "mlp" (VelocityNet on ObsEncoder features) or "vla"
    (pi0's action expert over the VLA prefix cache, vla_flow.py). The chain lives in the model's chunk
    shape [H, D] (pi0: zero-padded to 50 x 32); actions and log-probs use its first C steps and A dims.
    """

    family = "flow"
    can_guide_chunks = True
    can_act_from_noise = True

    def __init__(
        self, cfg: PolicyConfig, obs_shapes: dict[str, tuple[int, ...]], device: str = "cpu"
    ) -> None:
        super().__init__(cfg, obs_shapes)
        fcfg = cfg.flow
        if fcfg.conditioning == "vla":
            self.encoder = self.velocity_net = None
            self.prefix_encoder = VLAFlowPrefix(cfg, self.obs_shapes)
            self.model_shape = (fcfg.action_horizon or cfg.chunk_size, fcfg.max_action_dim or cfg.action_dim)
            if self.model_shape[0] < cfg.chunk_size or self.model_shape[1] < cfg.action_dim:
                raise ConfigError(
                    f"policy.flow.action_horizon x max_action_dim = {self.model_shape} is smaller than "
                    f"policy.chunk_size x action_dim = {self.chunk_shape}; the expert cannot emit that chunk"
                )
            self.state_dim = self.obs_shapes["state"][-1] if "state" in cfg.obs_keys else 0
            self.model_state_dim = fcfg.max_state_dim or max(self.state_dim, 1)
            if self.model_state_dim < self.state_dim:
                raise ConfigError(
                    f"policy.flow.max_state_dim={fcfg.max_state_dim} is below the env's state size "
                    f"{self.state_dim}; raise it (pi0: 32) or set 0 to use the state size"
                )
            self.action_expert = ActionExpert(
                expert_shape(cfg.vla_architecture),
                fcfg.vla_variant,
                self.model_shape[1],
                self.model_state_dim,
                self.prefix_encoder.rope_theta,
            )
            feature_dim = 2 * cfg.vla_architecture.language.hidden_size
        else:
            self.prefix_encoder = self.action_expert = None
            self.encoder = ObsEncoder(cfg, cfg.obs_keys, self.obs_shapes, self.normalizers)
            self.model_shape = self.chunk_shape
            self.velocity_net = VelocityNet(self.encoder.out_dim, self.chunk_shape, fcfg)
            feature_dim = self.encoder.out_dim
        self.value_encoder = self._make_value_encoder()
        self.head = (
            FlowNoiseHead(feature_dim, self.model_shape, fcfg)
            if fcfg.likelihood == "noise"
            else FlowSDEHead(fcfg)
        )
        self.critic = self._make_critic(feature_dim)
        self.aux_head = self._make_aux_head(feature_dim)
        self.to(device)

    def _vla_state(self, obs: TensorDict) -> torch.Tensor | None:
        """The normalized state [N, S], or None when the policy does not observe it."""
        if not self.state_dim:
            return None
        if "state" not in obs.keys():
            raise UserError(
                f"observation is missing key 'state' that the policy reads; present: {sorted(obs.keys())}"
            )
        state = obs["state"].float()
        if state.shape[-1] != self.state_dim:
            raise UserError(
                f"obs['state'] has per-env shape [{state.shape[-1]}]; "
                f"this policy was built for [{self.state_dim}]"
            )
        return self.normalizers["state"](state)

    def condition(
        self,
        obs: TensorDict,
        augment: bool = False,
        image_features: TensorDict | None = None,
        prefix: PrefixCache | None = None,
    ) -> tuple[torch.Tensor, VelocityFn]:
        """Features [N, F] and the velocity field v(x [M, H, D], t [M]) for M a multiple of N (env-major);
        `augment`: shift the images at random (SFT); `image_features`: a frozen CNN's outputs stored by
        `act` (MLP conditioning); `prefix`: a frozen VLA prefix's cache stored by `act`."""
        if self.encoder is not None:
            features = self.encoder(obs, augment=augment, image_features=image_features)

            def mlp_velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
                repeats = x.shape[0] // features.shape[0]
                cond = features if repeats == 1 else features.repeat_interleave(repeats, dim=0)
                return self.velocity_net(cond, x, t)

            return features, mlp_velocity
        state = self._vla_state(obs)
        if augment and state is not None:
            state = add_state_noise(state, self.cfg.state_noise_std)
        if prefix is None:
            prefix = self.prefix_encoder(obs, state, augment)
        n = prefix.mask.shape[0]
        padded = torch.zeros(n, self.model_state_dim, device=prefix.mask.device)
        if state is not None:
            padded[:, : self.state_dim] = state

        def expert_velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            repeats = x.shape[0] // n
            return self.action_expert(
                prefix.repeat_interleave(repeats), padded.repeat_interleave(repeats, dim=0), x, t
            )

        return prefix.features, expert_velocity

    def _executed(self, per_element: torch.Tensor) -> torch.Tensor:
        """[N, H, D] -> the executed part [N, C, A]."""
        return per_element[:, : self.chunk_shape[0], : self.chunk_shape[1]]

    def _initial_noise(self, features: torch.Tensor) -> torch.Tensor:
        """x0 ~ N(0, I) [N, H, D] for features [N, F]: the chain's start at t = 1."""
        return torch.randn(features.shape[0], *self.model_shape, device=features.device)

    @property
    def noise_shape(self) -> tuple[int, int]:
        return self.model_shape

    @torch.no_grad()
    def act_from_noise(self, obs: TensorDict, noise: torch.Tensor) -> torch.Tensor:
        """The plain ODE (K Euler steps) from `noise` [N, H, D]: act(deterministic=True)'s chunk for that
        x0, in env units."""
        image_features = self.encoder.frozen_image_features(obs) if self.encoder is not None else None
        _, velocity = self.condition(obs, image_features=image_features)
        x = euler_sample(velocity, noise.to(device=self.device, dtype=torch.float32), self.cfg.flow.num_steps)
        return self.normalizers["action"].unnormalize(self._executed(x))

    @torch.no_grad()
    def act(self, obs: TensorDict, deterministic: bool = False) -> ActOut:
        image_features = self.encoder.frozen_image_features(obs) if self.encoder is not None else None
        # A frozen VLA prefix is a fixed function of the observation: with policy.cache_frozen_prefix its
        # cache goes to replay, so the update runs the action expert alone instead of the towers and the
        # language model again.
        cached = (
            self.cfg.cache_frozen_prefix and self.prefix_encoder is not None and self.prefix_encoder.frozen
        )
        prefix = self.prefix_encoder(obs, self._vla_state(obs)) if cached else None
        features, velocity = self.condition(obs, image_features=image_features, prefix=prefix)
        x0 = self._initial_noise(features)
        replay, logprob = self.head.sample(velocity, features, x0, deterministic)
        if image_features is not None:  # frozen CNNs: the update reads their features from here
            replay["image_features"] = image_features
        if prefix is not None:
            replay["prefix_cache"] = prefix.to_replay()
        action_norm = self._executed(replay["chain"][:, -1])  # [N, C, A]
        return ActOut(
            actions=self.normalizers["action"].unnormalize(action_norm),
            logprob=reduce_logprob(self._executed(logprob), self.cfg.logprob_type),
            value=self._value(obs, features),
            replay=TensorDict(replay, batch_size=features.shape[:1]),
        )

    @torch.no_grad()
    def act_guided(self, obs: TensorDict, guidance: ChunkGuidance) -> torch.Tensor:
        """The deterministic ODE chunk [N, C, A] (env units), inpainted toward the previous chunk's actions
        (guidance.py). Draws x0 as `act` does: with max_weight = 0 it returns act(deterministic=True)'s
        actions for the same random state."""
        image_features = self.encoder.frozen_image_features(obs) if self.encoder is not None else None
        features, velocity = self.condition(obs, image_features=image_features)
        x0 = self._initial_noise(features)
        (c, a), (h, d) = self.chunk_shape, self.model_shape
        prev = guidance.prev_actions.to(device=x0.device, dtype=torch.float32)
        target = F.pad(self.normalizers["action"](prev), (0, d - a, 0, h - c))  # the model's zero padding
        steps = prefix_weights(guidance.delay.to(x0.device), guidance.overlap.to(x0.device), h)  # [N, H]
        weights = steps.unsqueeze(-1) * (torch.arange(d, device=x0.device) < a)  # padded dims unguided
        x = guided_euler_sample(velocity, x0, self.cfg.flow.num_steps, target, weights, guidance.max_weight)
        return self.normalizers["action"].unnormalize(self._executed(x))

    def evaluate(self, obs: TensorDict, replay: TensorDict) -> EvalOut:
        if "chain" not in replay.keys():
            raise UserError("replay lacks 'chain': it was not produced by a flow policy's act()")
        cache = replay.get("prefix_cache", None)
        features, velocity = self.condition(
            obs,
            image_features=replay.get("image_features", None),
            prefix=None if cache is None else PrefixCache.from_replay(cache),
        )
        logprob, entropy = self.head.log_prob(velocity, features, replay)
        return EvalOut(
            logprob=reduce_logprob(self._executed(logprob), self.cfg.logprob_type),
            entropy=entropy,
            value=self._value(obs, features),
        )

    def value(self, obs: TensorDict) -> torch.Tensor:
        if self.value_encoder is not None:
            return self._value(obs, None)
        return self._value(obs, self.condition(obs)[0])

    def transformer_stacks(self) -> list[tuple[str, TransformerStack]]:
        """The VLA prefix's stacks, then the action expert: one pass per Euler step over the whole action
        horizon and the state token."""
        if self.action_expert is None:
            return []
        e = expert_shape(self.cfg.vla_architecture)
        layers = e.num_layers * self.cfg.flow.num_steps
        expert = TransformerStack(self.model_shape[0] + 1, e.hidden_size, e.intermediate_size, layers)
        return [*super().transformer_stacks(), ("action_head", expert)]

    def action_program(self) -> ActionProgram:
        if self.velocity_net is None:  # pi0's expert over a VLA prefix cache
            raise not_exportable(f"flow with flow.conditioning={self.cfg.flow.conditioning}")
        return FlowODEProgram(self)

    def sft_loss(self, batch: TensorDict) -> torch.Tensor:
        """Flow-matching MSE of the velocity on the executed chunk, ignoring padded steps."""
        is_pad = batch.get("action_is_pad", None)  # [B, C] bool
        action = self.normalizers["action"](check_action_batch(batch, self.chunk_shape))  # [B, C, A]
        action = zero_padded_steps(action, is_pad)
        (c, a), (h, d) = self.chunk_shape, self.model_shape
        action = F.pad(action, (0, d - a, 0, h - c))  # [B, H, D]: the model's zero padding
        repeats = self.cfg.flow.sft_samples_per_obs
        features, velocity = self.condition(batch, augment=True)
        action = action.repeat_interleave(repeats, dim=0)
        beta = torch.distributions.Beta(
            torch.tensor(1.5, device=action.device), torch.tensor(1.0, device=action.device)
        )
        t = beta.sample((action.shape[0],)) * 0.999 + 0.001  # [B*R], more mass near t = 1 (noise)
        noise = torch.randn_like(action)
        x_t = t.view(-1, 1, 1) * noise + (1 - t.view(-1, 1, 1)) * action
        error = self._executed(velocity(x_t, t) - (noise - action)).pow(2)
        pad = None if is_pad is None else is_pad.repeat_interleave(repeats, dim=0)
        return masked_mean(error, pad) + self._aux_loss(batch, features)
