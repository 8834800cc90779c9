"""FiLM of image features by the instruction, as RT-1 conditions its EfficientNet on the task.

Where several objects differ only in colour, the language model has to bind the instruction's colour word to
one image location by attention, which a small model learns slowly from few scenes. FiLM lets the instruction
scale and shift each channel of the vision tower's features before they become tokens, so the named object's
cells can stand out in the tokens themselves.
"""

from __future__ import annotations

import torch
from torch import nn


class InstructionFiLM(nn.Module):
    """features [N, T, D] * (1 + gamma) + beta, with (gamma, beta) [N, D] a linear map of the mean of the
    instruction's token embeddings [N, L, H] over its real tokens (mask [N, L]). Zero-initialized: a new
    policy starts without modulation."""

    def __init__(self, text_dim: int, channels: int) -> None:
        super().__init__()
        self.linear = nn.Linear(text_dim, 2 * channels)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, features: torch.Tensor, text: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.unsqueeze(-1).to(text.dtype)
        pooled = (text * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # [N, H]
        repeats = features.shape[0] // pooled.shape[0]  # several cameras in one batch, camera-major
        gamma, beta = self.linear(pooled).repeat(repeats, 1).unsqueeze(1).chunk(2, dim=-1)
        return features * (1 + gamma) + beta
