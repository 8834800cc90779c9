"""The VLA side of the pi0-style flow policy: images + prompt -> prefix language model -> cached keys/values.

Prefix layout (openpi's embed_prefix): [patches of each camera] [prompt tokens, right-padded]. Attention is
bidirectional over the real prefix tokens and positions count real tokens only (cumsum(mask) - 1), so
padding changes nothing. Prompts follow openpi's PaligemmaTokenizer: pi0 reads the cleaned instruction and
a newline; pi05 reads "Task: ..., State: ...;" then "Action: ", the normalized state discretized into 256
bins over [-1, 1]. Checkpoints trained with LeRobot's processors keep a pi0 instruction as given and pad
the pi05 state to 32 dims first (policy.flow.clean_instruction, prompt_state_dim).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from torch import nn

from embodrl.obs_keys import IMAGE_KEYS
from embodrl.policies.config import PolicyConfig
from embodrl.policies.vla.modeling import VLABackbone, pool
from embodrl.policies.vla.prefix import check_vla_obs_keys
from embodrl.policies.vla.tokenizer import read_instructions, train_tokenizer

STATE_BINS = 256


@dataclass
class PrefixCache:
    """What the expert and the heads need from one prefix pass."""

    features: torch.Tensor  # [N, 2H] pooled prefix (value head and Flow-Noise std input)
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [N, kv_heads, P, head_dim]
    mask: torch.Tensor  # [N, P] bool, real prefix tokens

    def to_replay(self) -> TensorDict:
        """The cache as replay entries [N, ...] (keys and values stacked over layers), so an update whose
        prefix is frozen reads it back instead of running the towers and the language model again."""
        keys = torch.stack([k for k, _ in self.kv], dim=1)  # [N, L, kv_heads, P, head_dim]
        values = torch.stack([v for _, v in self.kv], dim=1)
        batch = self.mask.shape[:1]
        return TensorDict(
            {"features": self.features, "keys": keys, "values": values, "mask": self.mask}, batch_size=batch
        )

    @classmethod
    def from_replay(cls, replay: TensorDict) -> PrefixCache:
        """Inverse of `to_replay`."""
        keys, values = replay["keys"], replay["values"]
        kv = [(keys[:, i], values[:, i]) for i in range(keys.shape[1])]
        return cls(replay["features"], kv, replay["mask"])

    def repeat_interleave(self, repeats: int) -> PrefixCache:
        """Each row repeated `repeats` times (several (noise, t) draws per observation)."""
        if repeats == 1:
            return self
        rep = lambda x: x.repeat_interleave(repeats, dim=0)  # noqa: E731
        return PrefixCache(rep(self.features), [(rep(k), rep(v)) for k, v in self.kv], rep(self.mask))


def clean_instruction(text: str) -> str:
    """openpi's prompt cleaning: strip, underscores and newlines to spaces."""
    return text.strip().replace("_", " ").replace("\n", " ")


def discretize_state(state: torch.Tensor) -> torch.Tensor:
    """Normalized state [N, S] -> bin ids in [-1, 255] (numpy.digitize over 256 left edges, minus 1)."""
    edges = torch.linspace(-1.0, 1.0, STATE_BINS + 1, device=state.device)[:-1]
    return torch.bucketize(state.contiguous(), edges, right=True) - 1


def make_prompts(
    variant: str,
    instructions: Sequence[str],
    state: torch.Tensor | None,
    clean: bool = True,
    state_dim: int = 0,
) -> list[str]:
    """The text the language model reads, per openpi's PaligemmaTokenizer; `clean=False` keeps a pi0
    instruction as given and `state_dim` zero-pads the pi05 state first, as LeRobot's processors do."""
    if variant == "pi0" or state is None:
        texts = [clean_instruction(text) if clean else text for text in instructions]
        return [text if text.endswith("\n") else f"{text}\n" for text in texts]  # LeRobot: one newline
    cleaned = [clean_instruction(text) for text in instructions]
    if state_dim > state.shape[-1]:
        state = torch.nn.functional.pad(state, (0, state_dim - state.shape[-1]))
    bins = discretize_state(state).tolist()
    return [
        f"Task: {text}, State: {' '.join(map(str, row))};\nAction: "
        for text, row in zip(cleaned, bins, strict=True)
    ]


class VLAFlowPrefix(nn.Module):
    """Cameras (`policy.obs_keys`) + obs["instruction"] (+ the state for pi05) -> PrefixCache."""

    def __init__(self, cfg: PolicyConfig, obs_shapes: dict[str, tuple[int, ...]]) -> None:
        super().__init__()
        check_vla_obs_keys(cfg, obs_shapes)
        self.image_keys = tuple(k for k in cfg.obs_keys if k in IMAGE_KEYS)
        self.image_shift = cfg.image_shift
        self.variant = cfg.flow.vla_variant
        self.clean_instruction = cfg.flow.clean_instruction
        self.prompt_state_dim = cfg.flow.prompt_state_dim
        self.backbone = VLABackbone(
            cfg.vla_architecture,
            image_keys=self.image_keys,
            state_dim=0,  # pi0 feeds the state to the expert, pi05 to the prompt
            tokenizer=train_tokenizer(cfg.vla.instructions, cfg.vla.tokenizer_vocab_size),
            max_instruction_tokens=cfg.vla.max_instruction_tokens,
            instruction_table=cfg.vla.instructions,
            instruction_film=cfg.vla.instruction_film,
        )
        # The expert reads this model's key/value cache with gradients, which transformers drops under
        # activation checkpointing: policy.gradient_checkpointing covers the vision towers only here.
        self.backbone.language_model.supports_gradient_checkpointing = False

    @property
    def frozen(self) -> bool:
        """Whether no weight of the prefix trains (policy.train_expert_only, or the vision and language
        groups frozen): its cache is then a fixed function of the observation."""
        return not any(p.requires_grad for p in self.backbone.parameters())

    @property
    def rope_theta(self) -> float:
        return float(self.backbone.language_model.config.rope_parameters["rope_theta"])

    def forward(self, obs: TensorDict, state: torch.Tensor | None, augment: bool = False) -> PrefixCache:
        """Run the prefix once; `state` is the normalized (unpadded) state [N, S] or None; `augment`
        shifts the images at random by up to `policy.image_shift` (SFT)."""
        backbone = self.backbone
        prompts = make_prompts(
            self.variant,
            read_instructions(obs, backbone.instruction_table),
            state,
            self.clean_instruction,
            self.prompt_state_dim,
        )
        prefix = backbone.embed_prefix(obs, None, self.image_shift if augment else 0, prompts)
        embeds, mask = prefix.embeds, prefix.mask  # [N, P, H], [N, P]: [images][prompt, right-padded]
        n, p = mask.shape
        out = backbone.language_model(
            inputs_embeds=embeds,
            attention_mask=mask[:, None, None, :].expand(n, 1, p, p),  # bidirectional over real tokens
            position_ids=mask.long().cumsum(1) - 1,
            use_cache=True,
        )
        kv = [(layer.keys, layer.values) for layer in out.cache.layers]
        return PrefixCache(pool(out.last_hidden_state, mask), kv, mask)
