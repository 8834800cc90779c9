"""Multi-layer perceptrons and the value head every family shares."""

from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "elu": nn.ELU,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
}


def mlp(in_dim: int, hidden_dims: tuple[int, ...], out_dim: int, activation: str = "silu") -> nn.Sequential:
    """Linear layers with `activation` between them; the output layer is linear."""
    layers: list[nn.Module] = []
    for width in hidden_dims:
        layers += [nn.Linear(in_dim, width), ACTIVATIONS[activation]()]
        in_dim = width
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class ValueHead(nn.Module):
    """V(s): an MLP on pooled observation features [N, F] -> [N]."""

    def __init__(self, in_dim: int, hidden_dims: tuple[int, ...], activation: str = "tanh") -> None:
        super().__init__()
        self.net = mlp(in_dim, hidden_dims, 1, activation)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)
