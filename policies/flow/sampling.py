"""The Euler time grid and Gaussian step densities shared by the flow sampler and its likelihood heads.

Convention (openpi): x_t = t * noise + (1 - t) * action, so t = 1 is noise and t = 0 is the action;
the velocity target is v = noise - action and an Euler step from t_k to t_{k+1} = t_k - dt is
x_{k+1} = x_k - dt * v(x_k, t_k).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

# velocity(x [N, C, A], t [N]) -> v [N, C, A], with the observation features already bound.
VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def time_grid(num_steps: int, device: torch.device) -> torch.Tensor:
    """t_k = 1 - k / K for k = 0..K: [K + 1], from noise (1) to data (0)."""
    return torch.linspace(1.0, 0.0, num_steps + 1, device=device)


def euler_mean(x: torch.Tensor, v: torch.Tensor, dt: float) -> torch.Tensor:
    """The deterministic Euler step x - dt * v."""
    return x - dt * v


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, std^2)."""
    return -0.5 * ((x - mean) / std).pow(2) - std.log() - LOG_SQRT_2PI


def gaussian_entropy(std: torch.Tensor) -> torch.Tensor:
    """Elementwise entropy 0.5 * log(2 pi e std^2)."""
    return std.log() + LOG_SQRT_2PI + 0.5


def euler_sample(velocity: VelocityFn, x0: torch.Tensor, num_steps: int) -> torch.Tensor:
    """Plain K-step Euler integration from x0 at t = 1 to t = 0: the deterministic ODE sampler."""
    grid = time_grid(num_steps, x0.device)
    x = x0
    for k in range(num_steps):
        x = euler_mean(x, velocity(x, grid[k].expand(x.shape[0])), 1.0 / num_steps)
    return x
