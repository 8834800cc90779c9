"""Flow-SDE likelihood head (pi_RL, ODE-to-SDE from Flow-GRPO): one stochastic Euler-Maruyama step per call.

Noise level: sigma_t = a * sqrt(t / (1 - t)), with 1 - t_1 (= dt) in the denominator at t = 1.
Stochastic step (integrating from t to t - dt, keeping the ODE's marginals):
    mu  = x - dt * [v + sigma_t^2 / (2 t) * (x + (1 - t) * v)]
    std = sigma_t * sqrt(dt)
Each `sample` call draws one step index k* ~ U{0..K-1} for the whole batch; step k* is stochastic,
the others are deterministic Euler steps (a two-layer MDP whose inner action is x_{k*+1}). The replay
stores the chain, k* and a, so a re-evaluation scores the same transition even if `noise_level` is
annealed in between. Log-prob per action element [N, C, A] is log N(x_{k*+1}; mu, std^2); the
`action` / `chunk` granularities sum it over A / over C and A. With a = 0 sampling is plain Euler.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.flow.sampling import (
    VelocityFn,
    euler_mean,
    gaussian_entropy,
    gaussian_log_prob,
    time_grid,
)

MIN_STD = 1e-6  # with a = 0 the step is a Dirac; the floor keeps its log-density finite


class FlowSDEHead(nn.Module):
    """Hybrid ODE/SDE sampler with one stochastic step; no learned parameters."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.num_steps = cfg.num_steps
        self.noise_level = cfg.sde_noise_level  # `a`; a trainer may anneal it between calls

    def _sde_step(self, x: torch.Tensor, v: torch.Tensor, t: torch.Tensor, noise_level: torch.Tensor):
        """Mean and std [N, C, A] of the stochastic step from x at time t [N] with level a [N]."""
        dt = 1.0 / self.num_steps
        t = t.view(-1, 1, 1)
        one_minus_t = torch.where(t >= 1.0, torch.full_like(t, dt), 1.0 - t)  # 1 - t_1 = dt at t = 1
        sigma = noise_level.view(-1, 1, 1) * (t / one_minus_t).sqrt()
        mean = x - dt * (v + sigma.pow(2) / (2 * t) * (x + (1 - t) * v))
        return mean, (sigma * math.sqrt(dt)).expand_as(mean)

    def sample(self, velocity: VelocityFn, features: torch.Tensor, x0: torch.Tensor, deterministic: bool):
        """Run the hybrid chain from x0 [N, C, A]; returns (replay entries, log-prob [N, C, A]).

        Deterministic sampling is the plain Euler ODE, its step k* scored under the SDE transition.
        """
        n = x0.shape[0]
        grid = time_grid(self.num_steps, x0.device)
        step = torch.randint(0, self.num_steps, (), device=x0.device).expand(n)  # k*, shared by the batch
        noise_level = torch.full((n,), float(self.noise_level), device=x0.device)
        k_star = int(step[0])
        chain = [x0]
        for k in range(self.num_steps):
            x, t = chain[-1], grid[k].expand(n)
            v = velocity(x, t)
            if k == k_star:
                mean, std = self._sde_step(x, v, t, noise_level)
                x_next = (
                    euler_mean(x, v, 1.0 / self.num_steps)
                    if deterministic
                    else mean + std * torch.randn_like(mean)
                )
                logprob = gaussian_log_prob(x_next, mean, std.clamp_min(MIN_STD))
            else:
                x_next = euler_mean(x, v, 1.0 / self.num_steps)
            chain.append(x_next)
        replay = {"chain": torch.stack(chain, dim=1), "sde_step": step.clone(), "noise_level": noise_level}
        return replay, logprob

    def log_prob(
        self, velocity: VelocityFn, features: torch.Tensor, replay
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recompute the stored stochastic step's per-element log-prob [N, C, A] and its entropy [N]."""
        chain, step = replay["chain"], replay["sde_step"].long()  # [N, K+1, C, A], [N]
        rows = torch.arange(chain.shape[0], device=chain.device)
        x, x_next = chain[rows, step], chain[rows, step + 1]
        t = time_grid(self.num_steps, chain.device)[step]
        mean, std = self._sde_step(x, velocity(x, t), t, replay["noise_level"])
        std = std.clamp_min(MIN_STD)
        return gaussian_log_prob(x_next, mean, std), gaussian_entropy(std).mean((-2, -1))
