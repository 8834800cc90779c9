"""Sinusoidal features of the flow time t in [0, 1]."""

import math

import torch


def time_features(t: torch.Tensor, num_frequencies: int) -> torch.Tensor:
    """[N] -> [N, 2 * num_frequencies]: sin/cos of t at frequencies pi * 2^i."""
    freqs = math.pi * 2.0 ** torch.arange(num_frequencies, device=t.device, dtype=t.dtype)  # [F]
    angles = t.unsqueeze(-1) * freqs  # [N, F]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)
