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

    def __post_init__(self) -> None:
        for group in GROUPS:
            check_choice(f"policy.lora.{group}", getattr(self, group), MODES)
        check_positive("policy.lora.rank", self.rank)
        check_positive("policy.lora.alpha", self.alpha)
        check_positive("policy.lora.dropout", self.dropout, allow_zero=True)

    @property
    def uses_lora(self) -> bool:
        return "lora" in (self.vision, self.language, self.action_head)
