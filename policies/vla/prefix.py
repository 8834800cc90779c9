"""What the VLA families share: observation -> prefix embeddings, checkpoints carrying the tokenizer, the
transformer stacks for the memory estimate."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tensordict import TensorDict
from torch import nn

from embodrl.errors import ConfigError, UserError
from embodrl.obs_keys import IMAGE_KEYS, RGB, STATE, WRIST_RGB
from embodrl.policies.base import Policy, TransformerStack
from embodrl.policies.config import PolicyConfig
from embodrl.policies.modules.obs_encoder import add_state_noise
from embodrl.policies.vla.modeling import Prefix, VLABackbone
from embodrl.policies.vla.tokenizer import load_tokenizer, train_tokenizer

VLA_OBS_KEYS = (RGB, WRIST_RGB, STATE)


def check_vla_obs_keys(cfg: PolicyConfig, obs_shapes: dict[str, tuple[int, ...]]) -> None:
    """A VLA reads only cameras and the state (plus the instruction): refuse other or absent keys."""
    unsupported = [k for k in cfg.obs_keys if k not in VLA_OBS_KEYS]
    missing = [k for k in cfg.obs_keys if k not in obs_shapes]
    if unsupported or missing:
        raise UserError(
            f"a VLA policy reads {list(VLA_OBS_KEYS)} (and obs['instruction']) from the env (env keys: "
            f"{sorted(obs_shapes)}); policy.obs_keys lists {unsupported + missing}: remove them or "
            "change the env's obs_mode"
        )


class VLAPrefixEncoder(nn.Module):
    """Reads `cfg.obs_keys` (images, state) plus obs["instruction"] and embeds them as the VLA prefix."""

    def __init__(
        self, cfg: PolicyConfig, obs_shapes: dict[str, tuple[int, ...]], normalizers: nn.ModuleDict
    ) -> None:
        super().__init__()
        check_vla_obs_keys(cfg, obs_shapes)
        self.keys, self.image_shift = tuple(cfg.obs_keys), cfg.image_shift
        self.state_noise_std = cfg.state_noise_std
        self.uses_state = "state" in cfg.obs_keys
        # A plain dict, so the normalizer stays owned (and saved) by the policy alone, not registered twice.
        self._normalizers = {"state": normalizers["state"]} if self.uses_state else {}
        self.backbone = VLABackbone(
            cfg.vla_architecture,
            image_keys=[k for k in cfg.obs_keys if k in IMAGE_KEYS],
            state_dim=obs_shapes["state"][-1] if self.uses_state else 0,
            tokenizer=train_tokenizer(cfg.vla.instructions, cfg.vla.tokenizer_vocab_size),
            max_instruction_tokens=cfg.vla.max_instruction_tokens,
            prompt_format=cfg.vla.prompt_format,
            instruction_table=cfg.vla.instructions,
            instruction_film=cfg.vla.instruction_film,
        )

    @property
    def hidden_size(self) -> int:
        return self.backbone.hidden_size

    @property
    def frozen(self) -> bool:
        """Whether no weight of the prefix trains: its output is then a fixed function of the observation."""
        return not any(p.requires_grad for p in self.backbone.parameters())

    def forward(self, obs: TensorDict, augment: bool = False) -> Prefix:
        """The prefix of `obs`; `augment` shifts the images at random by up to `policy.image_shift` (SFT)."""
        missing = [k for k in self.keys if k not in obs.keys()]
        if missing:
            raise UserError(
                f"observation lacks {missing} that the policy reads; present: {sorted(obs.keys())}"
            )
        state = self._normalizers["state"](obs["state"].float()) if self.uses_state else None
        if augment and state is not None:
            state = add_state_noise(state, self.state_noise_std)
        return self.backbone.embed_prefix(obs, state, self.image_shift if augment else 0)


class VLAPolicy(Policy):
    """What the VLA families share beyond the contract: checkpoints carry the instruction tokenizer
    (tokenizer.json), the backbone reads the env's instruction table, and the transformer stacks."""

    prefix_encoder: nn.Module | None  # None: a family variant without the VLA (no tokenizer)

    def save_pretrained(self, directory: str | Path) -> None:
        super().save_pretrained(directory)
        if self.prefix_encoder is not None:
            self.prefix_encoder.backbone.tokenizer.save_pretrained(str(directory))

    def set_instruction_table(self, instructions: Sequence[str]) -> None:
        super().set_instruction_table(instructions)
        if self.prefix_encoder is not None:
            self.prefix_encoder.backbone.instruction_table = tuple(instructions)

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str = "cpu") -> Policy:
        policy = super().from_pretrained(directory, device=device)
        if policy.prefix_encoder is not None:
            # The constructor retrained a tokenizer from the config's corpus; the saved one is authoritative.
            policy.prefix_encoder.backbone.tokenizer = load_tokenizer(directory)
        return policy

    def caches_frozen_prefix_part(self) -> bool:
        """Whether policy.cache_frozen_prefix spares the update part of the prefix as it trains now: the
        whole prefix frozen (a family may cache a frozen bottom under trained layers too)."""
        return self.prefix_encoder is not None and self.prefix_encoder.frozen

    def transformer_stacks(self) -> list[tuple[str, TransformerStack]]:
        """The vision towers over every camera, then the language model over the whole prefix (patches,
        instruction, BOS and state) plus the C*A action positions."""
        if self.prefix_encoder is None:
            return []
        cfg = self.cfg
        arch = cfg.vla_architecture
        images = len([k for k in cfg.obs_keys if k in IMAGE_KEYS])
        stacks = [
            (
                "vision",
                TransformerStack(images * t.num_patches, t.hidden_size, t.intermediate_size, t.num_layers),
            )
            for t in arch.vision_towers
            if t.is_transformer
        ]
        patches = images * (arch.vision_towers[0].num_patches if arch.vision_towers else 0)
        lm = arch.language
        tokens = patches + cfg.vla.max_instruction_tokens + 2 + cfg.chunk_size * cfg.action_dim
        stacks.append(
            ("language", TransformerStack(tokens, lm.hidden_size, lm.intermediate_size, lm.num_layers))
        )
        return stacks


def require_bounded_actions(cfg: PolicyConfig, family: str) -> None:
    """Token bins and clipped diffusion samples live in [-1, 1]: actions must be normalized into it."""
    if cfg.action_normalization == "mean_std":
        raise ConfigError(
            f"the {family} family models actions in [-1, 1]; set policy.action_normalization=quantile "
            "(q01 -> -1, q99 -> +1, as OpenVLA) or identity for actions already in [-1, 1]"
        )


def check_replay(replay: TensorDict, keys: tuple[str, ...], family: str) -> None:
    """Raise a UserError when `replay` lacks what `evaluate` of `family` needs."""
    missing = [k for k in keys if k not in replay.keys()]
    if missing:
        raise UserError(f"replay lacks {missing}: it was not produced by a {family} policy's act()")
