"""The shared VLA prefix: vision towers, projector and a `transformers` language model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersModel,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    SiglipVisionConfig,
    SiglipVisionModel,
)
from transformers.masking_utils import create_causal_mask

from embodrl.errors import UserError
from embodrl.policies.modules.cnn import random_shift
from embodrl.policies.modules.pretrained_tower import PretrainedTower
from embodrl.policies.vision_config import VisionConfig
from embodrl.policies.vla.configuration import (
    LanguageModelConfig,
    VisionTowerConfig,
    VLAArchitecture,
    VLAConfig,
)
from embodrl.policies.vla.film import InstructionFiLM
from embodrl.policies.vla.tokenizer import read_instructions, tokenize_instructions, tokenize_openvla_prompts


def build_vision_tower(cfg: VisionTowerConfig) -> nn.Module:
    """A randomly initialised SigLIP or DINOv2 (with registers) ViT shaped by `cfg`, or the
    ImageNet-pretrained conv tower it names."""
    if not cfg.is_transformer:
        vision = VisionConfig(tower=cfg.kind, blocks=cfg.num_layers, train_tower=cfg.trainable)
        return PretrainedTower(vision, cfg.image_size)
    if cfg.kind == "siglip":
        config = SiglipVisionConfig(
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            image_size=cfg.image_size,
            patch_size=cfg.patch_size,
            vision_use_head=False,  # PaliGemma/Prismatic read patch features, not the pooled head
            **({"hidden_act": cfg.hidden_act} if cfg.hidden_act else {}),
        )
        return SiglipVisionModel(config)
    config = Dinov2WithRegistersConfig(
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        mlp_ratio=cfg.intermediate_size // cfg.hidden_size,
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
        num_register_tokens=cfg.num_register_tokens,
        **({"hidden_act": cfg.hidden_act} if cfg.hidden_act else {}),
    )
    return Dinov2WithRegistersModel(config)


def build_language_model(cfg: LanguageModelConfig, with_embeddings: bool = True) -> PreTrainedModel:
    """A randomly initialised decoder (LlamaModel/Qwen2Model/GemmaModel) built from its config."""
    config = AutoConfig.for_model(
        cfg.model_type,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        vocab_size=cfg.padded_vocab_size,
        max_position_embeddings=cfg.max_positions,
        rms_norm_eps=cfg.rms_norm_eps,
    )
    config._attn_implementation = "sdpa"  # takes our custom 4D masks (parallel decoding) as given
    model = AutoModel.from_config(config)
    if not with_embeddings:
        model.embed_tokens = None  # pi0's action expert reads embeddings from the action projection only
    return model


def build_projector(kind: str, vision_dim: int, hidden: int) -> nn.Module:
    """Vision features -> language-model width (PaliGemma linear, LLaVA MLP, Prismatic fused GELU MLP)."""
    if kind == "linear":
        return nn.Linear(vision_dim, hidden)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(vision_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden))
    return nn.Sequential(
        nn.Linear(vision_dim, 4 * vision_dim),
        nn.GELU(),
        nn.Linear(4 * vision_dim, hidden),
        nn.GELU(),
        nn.Linear(hidden, hidden),
    )


@dataclass
class Prefix:
    """Prefix embeddings [N, P, H] and which positions are real (not instruction padding) [N, P]."""

    embeds: torch.Tensor
    mask: torch.Tensor


class VLABackbone(nn.Module):
    """Main/wrist images, instruction and proprio state -> prefix embeddings -> language-model features.

    Sequence layout: [patches of each image key] [instruction, right-padded to a fixed length] [state].
    Images come first so every query position has at least one real key to attend to.
    """

    def __init__(
        self,
        architecture: VLAArchitecture,
        image_keys: Sequence[str],
        state_dim: int,
        tokenizer: PreTrainedTokenizerFast | None = None,
        max_instruction_tokens: int = VLAConfig.max_instruction_tokens,
        prompt_format: str = VLAConfig.prompt_format,
        instruction_table: Sequence[str] = (),
        instruction_film: bool = False,
    ) -> None:
        super().__init__()
        self.architecture, self.image_keys, self.tokenizer = architecture, tuple(image_keys), tokenizer
        self.instruction_table = tuple(instruction_table)
        self.max_instruction_tokens, self.prompt_format = max_instruction_tokens, prompt_format
        self.vision_towers = nn.ModuleList(build_vision_tower(t) for t in architecture.vision_towers)
        hidden = architecture.language.hidden_size
        self.projector = build_projector(architecture.projector, architecture.vision_dim, hidden)
        self.language_model = build_language_model(architecture.language)
        self.state_projection = (
            build_projector(architecture.state_projector, state_dim, hidden) if state_dim > 0 else None
        )
        self.film = InstructionFiLM(hidden, architecture.vision_dim) if instruction_film else None
        for i, tower in enumerate(architecture.vision_towers):
            self.register_buffer(f"image_mean_{i}", torch.tensor(tower.image_mean).view(1, 3, 1, 1), False)
            self.register_buffer(f"image_std_{i}", torch.tensor(tower.image_std).view(1, 3, 1, 1), False)

    @property
    def hidden_size(self) -> int:
        return self.architecture.language.hidden_size

    def encode_images(
        self, images: torch.Tensor, shift: int = 0, text: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """uint8 [N, H, W, 3] -> projected patch embeddings [N, patches, hidden]; `shift` > 0 first
        shifts each image at random by up to that many pixels (SFT augmentation); `text`: the instruction's
        token embeddings and mask, which modulate the tower's features (policy.vla.instruction_film)."""
        size = self.architecture.vision_towers[0].image_size
        if tuple(images.shape[1:3]) != (size, size):
            raise UserError(
                f"images are {images.shape[1]}x{images.shape[2]} px but this VLA preset expects "
                f"{size}x{size}; set env.image_size={size}, or build a new policy for these images "
                f"with policy.vla.image_size={images.shape[1]}"
            )
        if shift > 0:
            images = random_shift(images, shift)
        pixels = images.permute(0, 3, 1, 2).float() / 255.0  # [N, 3, H, W] in [0, 1]
        features = []
        towers = zip(self.vision_towers, self.architecture.vision_towers, strict=True)
        for i, (tower, cfg) in enumerate(towers):
            normalized = (pixels - getattr(self, f"image_mean_{i}")) / getattr(self, f"image_std_{i}")
            out = tower_features(tower, cfg, normalized)  # [N, tokens, D_i]
            features.append(out[:, out.shape[1] - cfg.num_patches :])  # drop CLS/register tokens (DINOv2)
        features = torch.cat(features, dim=-1)
        if self.film is not None and text is not None:
            features = self.film(features, *text)
        return self.projector(features)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [N, T] -> input embeddings [N, T, hidden]."""
        return self.language_model.embed_tokens(ids)

    def embed_prefix(
        self,
        obs: TensorDict,
        state: torch.Tensor | None,
        image_shift: int = 0,
        prompts: list[str] | None = None,
    ) -> Prefix:
        """Prefix of an observation batch; `state` is the already normalized proprio state [N, S];
        `image_shift`: see `encode_images`; `prompts` replace the instructions obs names as the text
        (the flow VLA's pi0 / pi05 prompts).

        "plain": [images][instruction, right-padded][state]; "openvla": [BOS][images][state][prompt,
        left-padded], so real tokens sit where OpenVLA(-OFT) puts them once positions skip the padding.
        """
        for key in self.image_keys:
            if key not in obs.keys():
                raise UserError(f"observation lacks camera {key!r}; present: {sorted(obs.keys())}")
        device = self.language_model.embed_tokens.weight.device
        instructions = read_instructions(obs, self.instruction_table) if prompts is None else prompts
        if self.prompt_format == "openvla":
            bos, ids, ids_mask = tokenize_openvla_prompts(
                self.tokenizer, instructions, self.max_instruction_tokens, device
            )
        else:
            ids, ids_mask = tokenize_instructions(
                self.tokenizer, instructions, self.max_instruction_tokens, device
            )
        text = self.embed_tokens(ids)
        images = []
        if self.image_keys:
            batch = torch.cat([obs[key] for key in self.image_keys], dim=0)  # one tower pass for all cameras
            patches = self.encode_images(batch, image_shift, (text, ids_mask))
            images = list(patches.chunk(len(self.image_keys), dim=0))
        states = [] if self.state_projection is None else [self.state_projection(state).unsqueeze(1)]
        if self.prompt_format == "openvla":
            parts = [self.embed_tokens(bos), *images, *states, text]
            text_at = len(parts) - 1
        else:
            parts = [*images, text, *states]
            text_at = len(images)
        masks = [torch.ones(part.shape[:2], dtype=torch.bool, device=device) for part in parts]
        masks[text_at] = ids_mask
        return Prefix(torch.cat(parts, dim=1), torch.cat(masks, dim=1))

    def run_layers_from(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, start: int
    ) -> torch.Tensor:
        """The language model from decoder layer `start` on, then its final norm: `hidden` [N, T, H] are
        the states entering that layer (`hidden_states[start]` of a full pass with the same mask and
        positions), so a frozen bottom's states cached once feed the trained top layers again and again.
        Returns the last hidden state [N, T, H], as the full pass would."""
        lm = self.language_model
        mask = create_causal_mask(
            config=lm.config,
            inputs_embeds=hidden,
            attention_mask=attention_mask,
            cache=None,
            position_ids=position_ids,
        )
        rotary = lm.rotary_emb(hidden, position_ids=position_ids)
        for layer in lm.layers[start : lm.config.num_hidden_layers]:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=rotary, position_ids=position_ids)
        return lm.norm(hidden)

    def forward(
        self,
        embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        cache=None,
        use_cache: bool = False,
        position_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ):
        """Run the language model on input embeddings [N, T, H] with a 2D padding mask [N, past + T] (causal)
        or a custom 4D boolean mask [N, 1, T, past + T] (True: may attend); `position_ids` [N, T] default to
        past + arange(T); `output_hidden_states` adds the states entering each layer. Returns the model
        output."""
        return self.language_model(
            inputs_embeds=embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
        )


def tower_features(tower: nn.Module, cfg: VisionTowerConfig, pixels: torch.Tensor) -> torch.Tensor:
    """Token features [N, tokens, D] of one tower at `cfg.feature_layer` (see VisionTowerConfig); a conv
    tower's feature-map cells, row by row."""
    if not cfg.is_transformer:
        return tower.features(pixels).flatten(2).transpose(1, 2)  # [N, C, h, w] -> [N, h * w, C]
    if cfg.feature_layer == -1:
        return tower(pixel_values=pixels).last_hidden_state
    return tower(pixel_values=pixels, output_hidden_states=True).hidden_states[cfg.feature_layer]


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids [N, T] that count real tokens only (mask [N, T] bool), so padding inside the sequence
    leaves no gap in the rotary positions: left-padded prompts line up with unpadded ones."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Prefix summary [N, 2H]: the mean over real positions (pi0.5's value input) joined with the last
    position, which under causal attention has seen the whole prefix (OpenVLA's value input)."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    mean = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
    return torch.cat([mean, hidden[:, -1]], dim=-1)


def prefix_lm_mask(prefix_mask: torch.Tensor, num_slots: int) -> torch.Tensor:
    """4D mask [N, 1, P+S, P+S]: causal over the prefix, and S slots that see the whole prefix and each
    other (OpenVLA-OFT's bidirectional action slots). Padding keys are never attended."""
    n, p = prefix_mask.shape
    total = p + num_slots
    idx = torch.arange(total, device=prefix_mask.device)
    allowed = (idx[None, :] <= idx[:, None]) | ((idx[:, None] >= p) & (idx[None, :] >= p))  # [T, T]
    keys = torch.cat([prefix_mask, torch.ones(n, num_slots, dtype=torch.bool, device=prefix_mask.device)], 1)
    return (allowed[None] & keys[:, None, :]).unsqueeze(1)
