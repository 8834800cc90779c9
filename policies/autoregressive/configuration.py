"""Autoregressive (token) family configuration (torch-free; nested in PolicyConfig as `autoregressive`)."""

from dataclasses import dataclass
from typing import ClassVar

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError

DECODINGS = ("sequential", "parallel", "oft")
CONDITIONINGS = ("vla", "mlp")


@dataclass
class AutoregressiveConfig:
    """How action tokens are decoded and sampled (OpenVLA and OpenVLA-OFT; docs/algorithms.md)."""

    # A run's own values apply to a checkpoint it loads with policy.init_from: how rollouts sample (RL often
    # explores at another temperature than SFT's) and the slot adapter (RL may add one to an SFT policy).
    RUN_SETTINGS: ClassVar[tuple[str, ...]] = ("temperature", "top_k", "slot_adapter")

    # "vla": tokens from the VLA's language model (OpenVLA / OpenVLA-OFT). "mlp": an MLP on the observation
    # encoder's features emits the logits of all C*A tokens at once (decoding=parallel): the same token
    # likelihood on state observations, for tasks a nano VLA cannot learn on a CPU.
    conditioning: str = "vla"
    hidden_dims: tuple[int, ...] = (256, 256, 256)  # the token MLP (conditioning=mlp)

    # "sequential": one token per forward pass with a KV cache (OpenVLA); "parallel": the whole chunk in
    # one pass over C*A learned placeholder slots that attend to each other bidirectionally; "oft":
    # OpenVLA-OFT's own parallel decoding (C*A zero placeholders then the EOS stop token, bidirectional
    # attention over the whole sequence, slot i's logits read one position earlier, as next-token logits).
    decoding: str = "sequential"
    temperature: float = 1.0  # sampling temperature; recorded in replay so evaluate() uses the same
    # Keep the k most likely action tokens; 0: all 256. evaluate() filters with the *current* logits, so a
    # replayed token that left the top k gets log-prob -inf (ratio 0), as in RLinf's top-k warper.
    top_k: int = 0
    # SFT targets: 0 = the demo's bin alone (cross-entropy, OpenVLA); > 0 = a Gaussian over the bins with
    # this std in bins (HL-Gauss, Farebrother et al. 2024). Neighbouring bins are neighbouring actions,
    # so the smoothed target keeps a few demos from driving every other bin's logit to -inf.
    label_sigma: float = 0.0
    # Width of a residual MLP on each action slot's last hidden state before the token head (0: none), its
    # output layer zero-initialized so that the policy acts as before it. OFT reads its actions through an
    # MLP head on those states; over cached slot states (policy.cache_frozen_prefix) RL then trains this
    # MLP with the head's action rows instead of a linear readout alone. A checkpoint's adapter is kept.
    slot_adapter: int = 0

    def __post_init__(self) -> None:
        check_choice("policy.autoregressive.decoding", self.decoding, DECODINGS)
        check_choice("policy.autoregressive.conditioning", self.conditioning, CONDITIONINGS)
        if self.conditioning == "mlp" and self.decoding != "parallel":
            raise ConfigError(
                "policy.autoregressive.conditioning=mlp predicts every action token in one pass; "
                f"set policy.autoregressive.decoding=parallel (got {self.decoding!r})"
            )
        check_positive("policy.autoregressive.temperature", self.temperature)
        check_positive("policy.autoregressive.top_k", self.top_k, allow_zero=True)
        check_positive("policy.autoregressive.label_sigma", self.label_sigma, allow_zero=True)
        check_positive("policy.autoregressive.slot_adapter", self.slot_adapter, allow_zero=True)
        if self.slot_adapter and self.conditioning == "mlp":
            raise ConfigError(
                "policy.autoregressive.slot_adapter adapts the language model's slot states; "
                "conditioning=mlp has none (its token MLP is the head already): set it to 0"
            )
