"""Guided real-time chunking (Black, Galliker, Levine 2025): Euler sampling that inpaints toward the
previous chunk's still-to-execute actions.

In the paper's time tau (0 noise, 1 action) each step takes the denoised estimate
A1 = A + (1 - tau) u, the weighted error e = W (Y - A1) to the target Y, its vector-Jacobian product
g = e dA1/dA, and steps with u + w(tau) g, where w(tau) = min(beta, (1 - tau) / (tau r^2)),
r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2). Here (sampling.py) t = 1 - tau, v = -u, so the denoised
estimate is x - t v and the step x - dt (v - w g). The soft mask W is 1 on the first d steps (executed
from the previous chunk while this one is computed), decays exponentially up to the end of the
overlap (H - s in the paper), and is 0 beyond.
"""

from __future__ import annotations

import math

import torch

from embodrl.policies.flow.sampling import VelocityFn, euler_mean, time_grid


def prefix_weights(delay: torch.Tensor, overlap: torch.Tensor, horizon: int) -> torch.Tensor:
    """The soft mask W [N, horizon] for per-sample delay d [N] and overlap L [N] (steps with a target):
    1 for i < d, c_i (e^c_i - 1) / (e - 1) with c_i = (L - i) / (L - d + 1) for d <= i < L, 0 beyond."""
    i = torch.arange(horizon, device=overlap.device, dtype=torch.float32)
    overlap = overlap.float().view(-1, 1)
    delay = torch.minimum(delay.float().view(-1, 1), overlap)
    c = ((overlap - i) / (overlap - delay + 1)).clamp(0.0, 1.0)
    decayed = c * torch.expm1(c) / (math.e - 1)
    return torch.where(i < delay, torch.ones_like(decayed), decayed) * (i < overlap)


def guidance_weight(t: float, max_weight: float) -> float:
    """min(beta, (1 - tau) / (tau r_tau^2)) at sampler time t = 1 - tau (beta where it diverges, at t = 1)."""
    tau = 1.0 - t
    if tau <= 0.0 or t <= 0.0:
        return max_weight
    return min(max_weight, (tau**2 + t**2) / (tau * t))


def guided_euler_sample(
    velocity: VelocityFn,
    x0: torch.Tensor,
    num_steps: int,
    target: torch.Tensor,
    weights: torch.Tensor,
    max_weight: float = 5.0,
) -> torch.Tensor:
    """K Euler steps from x0 [N, H, D] at t = 1, each pulled toward `target` [N, H, D] (normalized) where
    `weights` (broadcastable to it) are non-zero. With max_weight = 0 this is `euler_sample`, exactly.

    Deterministic given x0. The velocity is differentiated with respect to x (enable_grad inside, so the
    caller may run under no_grad; not under inference_mode, whose tensors cannot be differentiated)."""
    grid = time_grid(num_steps, x0.device)
    x, dt = x0, 1.0 / num_steps
    for k in range(num_steps):
        t = float(grid[k])
        t_batch = grid[k].expand(x.shape[0])
        strength = guidance_weight(t, max_weight)
        if strength == 0.0:
            x = euler_mean(x, velocity(x, t_batch), dt)
            continue
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(True)
            v = velocity(x_in, t_batch)
            denoised = x_in - t * v
            error = weights * (target - denoised)
            (correction,) = torch.autograd.grad(denoised, x_in, grad_outputs=error)
        x = euler_mean(x, v.detach() - strength * correction, dt)
    return x
