"""Normalization of states and actions with stats saved in the checkpoint (LeRobot stats.json style).

Stats per key ("state", "privileged", "action") hold `mean`, `std`, `q01`, `q99` vectors. Until stats
are set, every transform is the identity (mean 0, std 1, q01 -1, q99 +1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from embodrl.errors import UserError

STAT_NAMES = ("mean", "std", "q01", "q99")
EPS = 1e-6  # guards constant dimensions (std 0 or q99 == q01)


def compute_stats(data: torch.Tensor) -> dict[str, torch.Tensor]:
    """Stats over every leading dimension of `data` [..., D]."""
    flat = data.reshape(-1, data.shape[-1]).float()
    return {
        "mean": flat.mean(0),
        "std": flat.std(0, unbiased=False),
        "q01": torch.quantile(flat, 0.01, dim=0),
        "q99": torch.quantile(flat, 0.99, dim=0),
    }


class Normalizer(nn.Module):
    """Normalizes one vector-valued key [..., D] by mean/std, by q01/q99 to [-1, 1], or not at all.

    `hold_constant`: a dimension constant in the stats (spread under EPS) is read as that constant, since
    `unnormalize` maps every output there back to it. Actions use it: a label that moves a dimension the
    demos never moved (a human's wrist roll in a takeover) would otherwise be divided by EPS.
    """

    def __init__(
        self,
        key: str,
        dim: int,
        mode: str,
        min_std: float = 0.0,
        clip: float = 0.0,
        hold_constant: bool = False,
    ) -> None:
        super().__init__()
        self.key, self.dim, self.mode, self.min_std, self.clip = key, dim, mode, min_std, clip
        self.hold_constant = hold_constant
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("std", torch.ones(dim))
        self.register_buffer("q01", -torch.ones(dim))
        self.register_buffer("q99", torch.ones(dim))

    def set_stats(self, stats: Mapping[str, Sequence[float] | torch.Tensor]) -> None:
        """Copy `mean`, `std`, `q01`, `q99` (whichever are given) into the buffers."""
        for name, values in stats.items():
            if name not in STAT_NAMES:
                continue  # LeRobot stats also carry min/max/count, unused here
            values = torch.as_tensor(values, dtype=torch.float32).flatten()
            if values.numel() != self.dim:
                raise UserError(
                    f"normalization stats {self.key}.{name} have {values.numel()} values; "
                    f"the policy's {self.key} has {self.dim} dimensions"
                )
            getattr(self, name).copy_(values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Env units -> normalized units (clipped to [-clip, clip] when clip > 0)."""
        if self.mode == "mean_std":
            scale = self.std.clamp_min(self.min_std)
            if self.hold_constant:
                x = torch.where(scale < EPS, self.mean, x)
            x = (x - self.mean) / (scale + EPS)
        elif self.mode == "quantile":
            spread = self.q99 - self.q01
            if self.hold_constant:
                x = torch.where(spread < EPS, self.q01, x)
            x = 2 * (x - self.q01) / (spread + EPS) - 1
        return x.clamp(-self.clip, self.clip) if self.clip > 0 else x

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Normalized units -> env units."""
        if self.mode == "mean_std":
            return x * (self.std.clamp_min(self.min_std) + EPS) + self.mean
        if self.mode == "quantile":
            return (x + 1) / 2 * (self.q99 - self.q01 + EPS) + self.q01
        return x
