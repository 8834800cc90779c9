"""Policy configuration: fields shared by every family plus one nested dataclass per family (torch-free).

Adding a family: one `FAMILIES` line below ("name": "module:Class", imported lazily by registry.py),
then import its configuration dataclass and add one `PolicyConfig` field of the same name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError
from embodrl.obs_keys import OBS_KEYS, VECTOR_KEYS
from embodrl.policies.autoregressive.configuration import AutoregressiveConfig
from embodrl.policies.diffusion.configuration import DiffusionConfig
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.gaussian.configuration import GaussianConfig
from embodrl.policies.lora_config import LoRAConfig
from embodrl.policies.vision_config import VisionConfig
from embodrl.policies.vla.configuration import VLAArchitecture, VLAConfig, with_pretrained_tower

# family name -> "module:Class" of its Policy subclass
FAMILIES: dict[str, str] = {
    "gaussian": "embodrl.policies.gaussian.modeling:GaussianPolicy",
    "flow": "embodrl.policies.flow.modeling:FlowPolicy",
    "autoregressive": "embodrl.policies.autoregressive.modeling:AutoregressivePolicy",
    "diffusion": "embodrl.policies.diffusion.modeling:DiffusionPolicy",
}
LOGPROB_TYPES = (
    "token",
    "action",
    "chunk",
)  # per action element [N,C,A] / summed over A [N,C] / over C,A [N]
NORMALIZATIONS = ("mean_std", "quantile", "identity")  # quantile maps q01 -> -1 and q99 -> +1


@dataclass
class PolicyConfig:
    """Which family, what it observes, how it acts and how its log-probs are grouped."""

    family: str = "flow"  # a `FAMILIES` name
    init_from: str | None = None  # a checkpoint folder (e.g. from `embodrl sft`) to start from instead
    # Noise-space RL (algo.noise_policy): the checkpoint folder of the frozen policy whose initial noise this
    # policy's actions are (set by the trainer); `embodrl eval` then decodes them through it. Empty: actions
    # are the env's.
    steers: str = ""
    chunk_size: int = 4  # C actions per decision, executed open-loop
    action_dim: int = 7  # A, must match the env's action_spec.dim
    obs_keys: tuple[str, ...] = ("state",)  # observation keys the actor reads
    value_obs_keys: tuple[str, ...] = ()  # keys the critic reads (e.g. ("privileged",)); empty: obs_keys
    logprob_type: str = "token"
    state_normalization: str = "mean_std"  # for `state` and `privileged`
    # Floor on the std that normalizes `state`/`privileged` (mean_std): a few demos can show a dimension
    # (a cube's yaw, its x) barely varying, and dividing by that tiny std blows unseen values up.
    state_std_min: float = 0.05
    # Normalized `state`/`privileged` values are clipped to [-obs_clip, obs_clip] (0: no clip), as RL
    # libraries clip normalized observations: states the demos never showed stay in a bounded range.
    obs_clip: float = 5.0
    action_normalization: str = "mean_std"
    num_tasks: int = 0  # size of the task_id embedding table when "task_id" is observed
    # obs key -> the dataset feature it was trained from (SFT without a simulator, e.g. rgb ->
    # observation.images.front): `embodrl serve` and `deploy` then speak the dataset's names
    dataset_features: dict[str, str] = field(default_factory=dict)
    task_embedding_dim: int = 16
    vision: VisionConfig = field(default_factory=VisionConfig)  # from-scratch or pretrained image towers
    cnn_channels: tuple[int, ...] = (32, 64, 64, 64)  # stride-2 3x3 convs of the image encoder (scratch)
    image_feature_dim: int = 128
    image_shift: int = 4  # random-shift augmentation (pixels) of every camera in sft_loss (CNN, VLA); 0: off
    # Gaussian noise (normalized units) on the proprioceptive `state` in sft_loss only: a few demos can be
    # told apart by the arm's exact path, which a policy then memorizes instead of reading the image.
    state_noise_std: float = 0.0
    value_hidden_dims: tuple[int, ...] = (256, 256)
    # Auxiliary SFT targets: vector observation keys (e.g. [privileged]: the instructed object's pose, the
    # object - gripper offset, the goal) that a small head regresses from the actor's features during SFT,
    # so the features learn what the simulator knows for free (pretraining on simulated data). Only SFT
    # reads them: acting, serving and RL never need these keys.
    sft_aux_keys: tuple[str, ...] = ()
    sft_aux_weight: float = 1.0  # weight of the auxiliary MSE (normalized targets); 0: the head idles
    gaussian: GaussianConfig = field(default_factory=GaussianConfig)
    flow: FlowConfig = field(default_factory=FlowConfig)
    autoregressive: AutoregressiveConfig = field(default_factory=AutoregressiveConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    vla: VLAConfig = field(default_factory=VLAConfig)  # backbone of autoregressive and diffusion
    # Fine-tuning (policies/finetune.py), applied after the policy is built or loaded from `init_from`:
    lora: LoRAConfig = field(default_factory=LoRAConfig)  # full | lora | frozen per module group
    train_expert_only: bool = False  # freeze the VLM (vision + language): only the action expert/head train
    gradient_checkpointing: bool = False  # recompute the transformers towers' activations in backward
    # With the VLM frozen, the rollout stores what the frozen prefix gives the trained head in `replay` and
    # the update reuses it: the pi0-style prefix's keys/values (the flow expert then runs alone), the
    # diffusion readout's hidden states, the OFT slots' last hidden states (only the action rows of the LM
    # head train). Per decision the pi0 cache is layers x 2 x kv_heads x prefix tokens x head_dim floats
    # (pi0-3b on two 224 px cameras: ~20 MB), so it is off by default and for small VLAs.
    cache_frozen_prefix: bool = False

    def __post_init__(self) -> None:
        check_choice("policy.family", self.family, tuple(FAMILIES))
        check_positive("policy.chunk_size", self.chunk_size)
        check_positive("policy.action_dim", self.action_dim)
        check_positive("policy.image_shift", self.image_shift, allow_zero=True)
        check_positive("policy.state_noise_std", self.state_noise_std, allow_zero=True)
        check_choice("policy.logprob_type", self.logprob_type, LOGPROB_TYPES)
        check_positive("policy.state_std_min", self.state_std_min, allow_zero=True)
        check_positive("policy.obs_clip", self.obs_clip, allow_zero=True)
        check_choice("policy.state_normalization", self.state_normalization, NORMALIZATIONS)
        check_choice("policy.action_normalization", self.action_normalization, NORMALIZATIONS)
        if not self.obs_keys:
            raise ConfigError(
                "policy.obs_keys is empty; list the observation keys the policy reads, e.g. [state]"
            )
        for key in self.read_keys:
            check_choice("policy.obs_keys entry", key, OBS_KEYS)
        if "task_id" in self.read_keys:
            check_positive("policy.num_tasks (needed because task_id is observed)", self.num_tasks)
        for key in self.sft_aux_keys:
            check_choice("policy.sft_aux_keys entry", key, VECTOR_KEYS)
        check_positive("policy.sft_aux_weight", self.sft_aux_weight, allow_zero=True)
        if self.vision.pretrained and self.vla.custom is not None:
            raise ConfigError(
                f"policy.vision.tower={self.vision.tower} replaces a preset's vision towers; this policy's "
                "architecture comes from an imported checkpoint, which brings its own: drop policy.vision"
            )
        if self.train_expert_only and "lora" in (self.lora.vision, self.lora.language):
            raise ConfigError(
                "policy.train_expert_only freezes the VLM, but policy.lora adapts its vision or language "
                "group; drop one of the two"
            )

    @property
    def read_keys(self) -> tuple[str, ...]:
        """Every observation key the policy reads, actor's then critic's, each once: act() evaluates both."""
        return tuple(dict.fromkeys((*self.obs_keys, *self.value_obs_keys)))

    @property
    def normalized_keys(self) -> tuple[str, ...]:
        """The keys the policy normalizes: those it reads, then its auxiliary SFT targets."""
        return tuple(dict.fromkeys((*self.read_keys, *self.sft_aux_keys)))

    @property
    def vla_architecture(self) -> VLAArchitecture:
        """The VLA backbone to build: `vla.architecture`, its vision towers replaced by the pretrained one
        that `vision` names."""
        architecture = self.vla.architecture
        return with_pretrained_tower(architecture, self.vision) if self.vision.pretrained else architecture

    @property
    def instruction_table(self) -> tuple[str, ...]:
        """The env's instructions by task id, through which a language policy reads its prompt; () when
        none was given yet (a new config, an imported checkpoint)."""
        return self.vla.instructions

    def with_instruction_table(self, instructions: Sequence[str]) -> PolicyConfig:
        """This config reading prompts from `instructions` (the VLA tokenizer is trained on them)."""
        return dataclasses.replace(self, vla=dataclasses.replace(self.vla, instructions=tuple(instructions)))

    @property
    def trained_groups(self) -> LoRAConfig:
        """`lora` with the VLM's groups frozen when `train_expert_only` is set."""
        if not self.train_expert_only:
            return self.lora
        return dataclasses.replace(self.lora, vision="frozen", language="frozen")

    def to_dict(self) -> dict:
        """Plain nested dict, JSON-ready (`from_dict` turns JSON lists back into tuples)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PolicyConfig:
        """Inverse of `to_dict`; unknown keys raise a ConfigError naming them."""
        return _build(cls, data, "policy")


# Applied to a loaded checkpoint (fine-tuning), or filled in from the env or by an import (num_tasks; the
# VLA's instruction table and, for imported weights, its whole architecture in `vla.custom`): a
# difference there is not a setting the checkpoint replaces.
_NOT_FROM_CHECKPOINT = (
    "init_from",
    "num_tasks",
    "dataset_features",
    "vla",
    "lora",
    "train_expert_only",
    "gradient_checkpointing",
    "cache_frozen_prefix",
    "logprob_type",  # how RL groups the log-probs for its ratio; no weight depends on it
    "sft_aux_weight",  # a training setting: fine-tuning a pretrained base may drop its auxiliary loss
)


def run_settings(family_cfg: object) -> tuple[str, ...]:
    """The fields of a family's config that a run sets over a checkpoint (`RUN_SETTINGS`: how rollouts
    sample, modules a run adds): like the fine-tuning settings, the experiment's values apply to a
    checkpoint loaded with `init_from`."""
    return getattr(type(family_cfg), "RUN_SETTINGS", ())


def overridden_by_checkpoint(experiment: PolicyConfig, checkpoint: PolicyConfig) -> list[str]:
    """The experiment's policy settings that a checkpoint loaded with `init_from` replaces with its own,
    as "key=experiment value (checkpoint: value)": the shared fields and the checkpoint family's."""
    differences = []
    for f in dataclasses.fields(PolicyConfig):
        if f.name in _NOT_FROM_CHECKPOINT or (f.name in FAMILIES and f.name != checkpoint.family):
            continue
        ours, theirs = getattr(experiment, f.name), getattr(checkpoint, f.name)
        if dataclasses.is_dataclass(ours):
            differences += [
                f"{f.name}.{sub.name}={getattr(ours, sub.name)} (checkpoint: {getattr(theirs, sub.name)})"
                for sub in dataclasses.fields(ours)
                if getattr(ours, sub.name) != getattr(theirs, sub.name) and sub.name not in run_settings(ours)
            ]
        elif ours != theirs:
            differences.append(f"{f.name}={ours} (checkpoint: {theirs})")
    return differences


def _build(cls: type, data: dict, prefix: str):
    """Instantiate dataclass `cls` from a (nested) dict, turning JSON lists back into tuples."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown keys {unknown} in {prefix}; valid keys: {', '.join(fields)}")
    kwargs = {}
    for name, value in data.items():
        default = fields[name].default_factory() if callable(fields[name].default_factory) else None
        if dataclasses.is_dataclass(default):
            value = _build(type(default), value, f"{prefix}.{name}")
        elif isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)
