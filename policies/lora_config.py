"""Fine-tuning mode per module group of a VLA policy (torch-free; nested in PolicyConfig as `lora`)."""

from dataclasses import dataclass

from embodrl.choices import check_choice, check_positive

MODES = ("full", "lora", "frozen")
GROUPS = ("vision", "language", "action_head")


@dataclass
class LoRAConfig:
    """Per module group (policies/lora.py): "full" fine-tuning, "lora" adapters on a frozen base, or
    "frozen"; and the adapters' shape. All "full" (the default) is plain fine-tuning without adapters."""

    vision: str = "full"
    language: str = "full"
    action_head: str = "full"
    rank: int = 32  # OpenVLA's LoRA recipe: r=32, alpha=16 on all linear layers
    alpha: float = 16.0
    dropout: float = 0.0
    # N > 0: only the top N decoder layers of the VLM's language model (and its final norm) take
    # `language`'s mode; the layers under them, the token embeddings and the state token's projection,
    # which feed only those layers, stay frozen. With a frozen vision group and
    # policy.cache_frozen_prefix, RL then stores the states entering the first trained layer and each
    # update runs the top N layers alone.
    language_layers: int = 0

    def __post_init__(self) -> None:
        for group in GROUPS:
            check_choice(f"policy.lora.{group}", getattr(self, group), MODES)
        check_positive("policy.lora.rank", self.rank)
        check_positive("policy.lora.alpha", self.alpha)
        check_positive("policy.lora.dropout", self.dropout, allow_zero=True)
        check_positive("policy.lora.language_layers", self.language_layers, allow_zero=True)

    @property
    def uses_lora(self) -> bool:
        return "lora" in (self.vision, self.language, self.action_head)
