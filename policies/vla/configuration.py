"""VLA backbone architectures: the `nano` CPU preset and full-size OpenVLA and pi0 presets (torch-free)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError
from embodrl.policies.vision_config import IMAGENET_MEAN_STD, VisionConfig

VISION_KINDS = ("siglip", "dinov2")  # ViTs; a pretrained conv tower is named by its vision_config.TOWERS key
LANGUAGE_MODEL_TYPES = ("llama", "qwen2", "gemma")
PROJECTORS = ("linear", "mlp", "fused_gelu_mlp")
PROMPT_FORMATS = ("plain", "openvla")
SIGLIP_MEAN_STD = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # SigLIP expects pixels in [-1, 1]


@dataclass(frozen=True)
class VisionTowerConfig:
    """One ViT image encoder; its patch features (no CLS/register tokens) feed the projector."""

    kind: str  # "siglip" (SiglipVisionModel) or "dinov2" (Dinov2WithRegistersModel)
    image_size: int
    patch_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    num_register_tokens: int = 0  # dinov2 only
    image_mean: tuple[float, float, float] = SIGLIP_MEAN_STD[0]
    image_std: tuple[float, float, float] = SIGLIP_MEAN_STD[1]
    hidden_act: str | None = None  # None: the kind's transformers default; Prismatic's timm ViTs use "gelu"
    # -1: the final block's output after the final LayerNorm; -k (k >= 2): the raw output of the k-th block
    # from the end (Prismatic/OpenVLA read -2, timm's get_intermediate_layers(n={L - 2})).
    feature_layer: int = -1
    # A pretrained conv tower (kind in vision_config.TOWERS): patch_size is its stride, hidden_size its
    # channels, num_layers its blocks; `trainable` False keeps its weights fixed.
    trainable: bool = True

    @property
    def is_transformer(self) -> bool:
        return self.kind in VISION_KINDS

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True)
class LanguageModelConfig:
    """A decoder-only transformer built from its `transformers` config (no pretrained weights)."""

    model_type: str  # "llama" | "qwen2" | "gemma"
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # real vocabulary; action tokens are its last 256 ids
    embedding_rows: int = 0  # rows of the embedding/LM head when padded (OpenVLA: 32000 + <PAD> -> 32064)
    max_positions: int = 2048
    rms_norm_eps: float = 1e-6

    @property
    def padded_vocab_size(self) -> int:
        return max(self.embedding_rows, self.vocab_size)


@dataclass(frozen=True)
class VLAArchitecture:
    """Vision towers (features concatenated) -> projector -> language model; optional pi0 action expert."""

    vision_towers: tuple[VisionTowerConfig, ...]
    projector: str  # "linear" (PaliGemma), "mlp" (LLaVA), "fused_gelu_mlp" (Prismatic DINO+SigLIP)
    language: LanguageModelConfig
    action_expert: LanguageModelConfig | None = None  # pi0's Gemma-300M expert (used by flow policies)
    state_projector: str = "linear"  # "mlp": Linear, GELU, Linear (OpenVLA-OFT's proprio projector)

    @classmethod
    def from_dict(cls, data: dict) -> VLAArchitecture:
        """Inverse of `dataclasses.asdict` (JSON lists back to tuples)."""

        def language(d: dict | None) -> LanguageModelConfig | None:
            return None if d is None else LanguageModelConfig(**d)

        towers = tuple(
            VisionTowerConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in t.items()})
            for t in data["vision_towers"]
        )
        rest = {k: v for k, v in data.items() if k not in ("vision_towers", "language", "action_expert")}
        return cls(
            towers,
            language=language(data["language"]),
            action_expert=language(data.get("action_expert")),
            **rest,
        )

    @property
    def vision_dim(self) -> int:
        return sum(tower.hidden_size for tower in self.vision_towers)


def with_pretrained_tower(architecture: VLAArchitecture, vision: VisionConfig) -> VLAArchitecture:
    """`architecture` with one pretrained conv tower, at the first tower's image size, in place of its
    vision towers: the cells of its feature map are the image tokens."""
    channels, stride = vision.geometry()
    size = architecture.vision_towers[0].image_size
    if size % stride:
        raise ConfigError(
            f"images of {size} px do not tile into the {stride} px cells of {vision.tower} after "
            f"{vision.blocks} blocks; set policy.vla.image_size to a multiple of {stride}"
        )
    tower = VisionTowerConfig(
        vision.tower,
        size,
        stride,
        channels,
        vision.blocks,
        0,
        0,
        image_mean=IMAGENET_MEAN_STD[0],
        image_std=IMAGENET_MEAN_STD[1],
        trainable=vision.train_tower,
    )
    return dataclasses.replace(architecture, vision_towers=(tower,))


_SIGLIP_SO400M_224 = VisionTowerConfig("siglip", 224, 14, 1152, 27, 16, 4304)

PRESETS: dict[str, VLAArchitecture] = {
    # A few M parameters: 64 px images in 8 px patches, a 4-layer Llama with a 1024-token vocabulary.
    "nano": VLAArchitecture(
        vision_towers=(VisionTowerConfig("siglip", 64, 8, 96, 2, 4, 256),),
        projector="mlp",
        language=LanguageModelConfig("llama", 128, 4, 4, 2, 32, 384, vocab_size=1024, max_positions=512),
    ),
    # OpenVLA-7B: Prismatic DINOv2 ViT-L/14 (4 registers) + SigLIP SO400M/14 at 224 px (timm's exact GELU,
    # features of the second-to-last block), fused GELU MLP, Llama-2 7B with the 32000-token vocabulary
    # (+ <PAD>) padded to 32064 rows.
    "openvla-7b": VLAArchitecture(
        vision_towers=(
            VisionTowerConfig(
                "dinov2",
                224,
                14,
                1024,
                24,
                16,
                4096,
                4,
                *IMAGENET_MEAN_STD,
                hidden_act="gelu",
                feature_layer=-2,
            ),
            dataclasses.replace(_SIGLIP_SO400M_224, hidden_act="gelu", feature_layer=-2),
        ),
        projector="fused_gelu_mlp",
        language=LanguageModelConfig("llama", 4096, 32, 32, 32, 128, 11008, 32000, 32064, 4096),
    ),
    # pi0: PaliGemma (SigLIP SO400M/14 at 224 px, linear projector, Gemma 2B) + Gemma-300M action expert.
    "pi0-3b": VLAArchitecture(
        vision_towers=(_SIGLIP_SO400M_224,),
        projector="linear",
        language=LanguageModelConfig("gemma", 2048, 18, 8, 1, 256, 16384, 257152, max_positions=8192),
        action_expert=LanguageModelConfig("gemma", 1024, 18, 8, 1, 256, 4096, 257152, max_positions=8192),
    ),
}


@dataclass
class VLAConfig:
    """Which backbone preset, and how instructions are tokenized (nested in PolicyConfig as `vla`)."""

    preset: str = "nano"  # a key of PRESETS
    # An imported checkpoint's architecture (policies/pretrained/); overrides `preset` when set.
    custom: VLAArchitecture | None = None
    # "plain": [images][instruction, right-padded][state]; "openvla": [BOS][images][state]["In: What
    # action should the robot take to {instruction}?\nOut:" + "▁", left-padded], as OpenVLA(-OFT).
    prompt_format: str = "plain"
    # Corpus the instruction tokenizer (byte-level BPE) is trained on when a policy is created; the
    # trained tokenizer is saved with the checkpoint. Empty: bytes only, which still encodes any text.
    instructions: tuple[str, ...] = ()
    tokenizer_vocab_size: int = 512  # text tokens; must leave the last 256 ids free for action tokens
    max_instruction_tokens: int = 16  # fixed padded length, so positions never depend on the batch
    # The vision towers' geometry for a new policy; 0 keeps the preset's (nano: 64 px in 8 px patches).
    # The image tokens the language model reads grow as (image_size / patch_size) ** 2.
    image_size: int = 0
    patch_size: int = 0
    # FiLM of the vision tower's features by the instruction (RT-1's conditioning): per-channel scale and
    # shift from the instruction's mean token embedding, so the object it names can stand out in the
    # image tokens themselves (policies/vla/film.py)
    instruction_film: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.custom, dict):  # read back from config.json
            self.custom = VLAArchitecture.from_dict(self.custom)
        check_choice("policy.vla.preset", self.preset, tuple(PRESETS))
        check_choice("policy.vla.prompt_format", self.prompt_format, PROMPT_FORMATS)
        check_positive("policy.vla.max_instruction_tokens", self.max_instruction_tokens)
        self._check_tower_geometry()
        free = self.architecture.language.vocab_size - 256
        # the trained tokenizer only; the openvla format uses the checkpoint's own (Llama) tokenizer
        if self.prompt_format == "plain" and not 256 < self.tokenizer_vocab_size <= free:
            raise ConfigError(
                f"policy.vla.tokenizer_vocab_size={self.tokenizer_vocab_size} must be in (256, {free}] "
                f"for preset {self.preset!r} (byte alphabet below, 256 action tokens above)"
            )

    def _check_tower_geometry(self) -> None:
        check_positive("policy.vla.image_size", self.image_size, allow_zero=True)  # 0: the preset's
        check_positive("policy.vla.patch_size", self.patch_size, allow_zero=True)
        if not (self.image_size or self.patch_size):
            return
        if self.custom is not None:  # the imported position embeddings fix the patch grid
            raise ConfigError(
                "policy.vla.image_size and patch_size apply to a new policy built from a preset; this "
                "policy's architecture comes from an imported checkpoint, whose vision towers keep their "
                "own size: set env.image_size to theirs instead"
            )
        for tower in self.architecture.vision_towers:
            if tower.image_size % tower.patch_size:
                raise ConfigError(
                    f"policy.vla.image_size={tower.image_size} is not a multiple of the patch size "
                    f"{tower.patch_size}; choose sizes that tile the image"
                )

    @property
    def architecture(self) -> VLAArchitecture:
        if self.custom is not None:
            return self.custom
        preset = PRESETS[self.preset]
        if not (self.image_size or self.patch_size):
            return preset
        towers = tuple(
            dataclasses.replace(
                t, image_size=self.image_size or t.image_size, patch_size=self.patch_size or t.patch_size
            )
            for t in preset.vision_towers
        )
        return dataclasses.replace(preset, vision_towers=towers)
