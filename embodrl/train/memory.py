"""Training memory estimate printed before a run: parameters, gradients, optimizer state, activations.

Per GPU, before sharding. Activations follow the usual transformer count of values kept for backward per
token and layer (Korthikanti et al., 2022, with fused attention so no T x T scores): ~8 hidden-sized and 4
MLP-sized tensors; gradient checkpointing keeps only each layer's input plus one layer's full set. A stack
keeps nothing when neither it nor anything before it trains (a frozen VLM under an action expert: autograd
saves no activations for inputs that need no gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

from embodrl.policies.base import Policy, TransformerStack
from embodrl.policies.lora import group_of

FORWARD_ORDER = ("vision", "language", "action_head")  # parameter groups in the order the forward pass runs

GIB = 1024**3
ACTIVATION_BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per component for one micro-batch."""

    parameters: int  # counts
    trainable: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes

    def report(self) -> str:
        """Human-readable lines, in GiB."""
        rows = [
            ("parameters", self.param_bytes, _count(self.parameters)),
            ("gradients", self.grad_bytes, f"{_count(self.trainable)} trainable"),
            ("optimizer state", self.optimizer_bytes, ""),
            ("activations / micro-batch", self.activation_bytes, ""),
            ("total", self.total_bytes, ""),
        ]
        return "\n".join(
            f"memory  {name:<26}{size / GIB:8.2f} GiB  {note}".rstrip() for name, size, note in rows
        )


def _count(n: int) -> str:
    """A parameter count as 7.24B / 3.10M / 52.1K: small policies must not print 0.00B."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def estimate_memory(
    parameters: int,
    trainable: int,
    stacks: list[TransformerStack],
    micro_batch: int,
    param_bytes: int = 4,  # fp32 master weights; 2 for pure bf16
    activation_bytes: int = 2,  # bf16 autocast; 4 in fp32
    optimizer_states: int = 2,  # Adam: exp_avg and exp_avg_sq, fp32
    gradient_checkpointing: bool = False,
) -> MemoryEstimate:
    """Memory of training with `trainable` of `parameters` receiving gradients and optimizer state."""
    values = 0
    for s in stacks:
        per_layer = s.tokens * (8 * s.hidden + 4 * s.intermediate)
        kept = s.layers * s.tokens * s.hidden + per_layer if gradient_checkpointing else s.layers * per_layer
        values += kept
    return MemoryEstimate(
        parameters=parameters,
        trainable=trainable,
        param_bytes=parameters * param_bytes,
        grad_bytes=trainable * param_bytes,
        optimizer_bytes=trainable * optimizer_states * 4,
        activation_bytes=micro_batch * values * activation_bytes,
    )


def policy_stacks(policy: Policy) -> list[TransformerStack]:
    """The policy's transformer stacks that keep activations for backward: from the first one whose group
    trains (or follows a trained group) on; [] for a policy without transformers."""
    stacks = policy.transformer_stacks()
    trained = {group_of(name) for name, p in policy.named_parameters() if p.requires_grad} - {None}  # critic
    first = min((FORWARD_ORDER.index(g) for g in trained), default=len(FORWARD_ORDER))
    return [stack for group, stack in stacks if FORWARD_ORDER.index(group) >= first]


def estimate_policy_memory(policy: Policy, micro_batch: int, precision: str = "bf16") -> MemoryEstimate:
    """`estimate_memory` for a built policy (its parameter counts, its transformer stacks and its
    policy.gradient_checkpointing), activations kept in `precision` ("fp32" | "bf16" autocast)."""
    params = list(policy.parameters())
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    checkpointing = policy.cfg.gradient_checkpointing
    return estimate_memory(
        total,
        trainable,
        policy_stacks(policy),
        micro_batch,
        activation_bytes=ACTIVATION_BYTES[precision],
        gradient_checkpointing=checkpointing,
    )
