"""Flow-Noise likelihood head (pi_RL, after ReinFlow): a learned noise net makes every Euler step Gaussian.

Chain: x_0 ~ N(0, I) at t = 1, then for k = 0..K-1
    x_{k+1} ~ N(mu_k, sigma_k^2),  mu_k = x_k - dt * v(x_k, t_k),  sigma_k = sigma(features, t_k)
with sigma tanh-bounded per element in [noise_std_min, noise_std_max]; x_K is the normalized action.
Log-probability per action element (c, a), i.e. the `token` granularity [N, C, A]:
    "sum":  log N(x_0; 0, 1) + sum_k log N(x_{k+1}; mu_k, sigma_k^2)   the exact joint chain density
    "mean": the same sum divided by its K + 1 terms (pi_RL's choice: the PPO ratio becomes the
            geometric mean of the per-step ratios, a looser trust region; the prototype learned faster).
`action` and `chunk` granularities sum this per-element value over A, or over C and A. The initial
term does not depend on the parameters (it cancels in ratios) but keeps "sum" an exact density.
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
from embodrl.policies.modules.mlp import mlp
from embodrl.policies.modules.time_features import time_features


class FlowNoiseHead(nn.Module):
    """The learned per-step std and the Flow-Noise chain sampler and log-density."""

    def __init__(self, feature_dim: int, chunk_shape: tuple[int, int], cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg, self.chunk_shape = cfg, chunk_shape
        in_dim = feature_dim + 2 * cfg.num_time_frequencies
        self.net = mlp(in_dim, cfg.noise_hidden_dims, math.prod(chunk_shape), activation="tanh")
        # Zero last layer: sigma starts at the geometric middle of the range (0.113 for [0.08, 0.16]).
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)
        self.log_std_range = (math.log(cfg.noise_std_min), math.log(cfg.noise_std_max))

    def std(self, features: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """sigma(features [N, F], t [N]) -> [N, C, A]."""
        raw = self.net(torch.cat([features, time_features(t, self.cfg.num_time_frequencies)], dim=-1))
        lo, hi = self.log_std_range
        return (lo + (hi - lo) * (torch.tanh(raw) + 1) / 2).exp().view(-1, *self.chunk_shape)

    def _step(self, velocity: VelocityFn, features: torch.Tensor, x: torch.Tensor, t: torch.Tensor):
        """Mean and std of x_{k+1} given x_k = x at time t [N]."""
        return euler_mean(x, velocity(x, t), 1.0 / self.cfg.num_steps), self.std(features, t)

    def _reduce(self, chain_sum: torch.Tensor) -> torch.Tensor:
        return chain_sum / (self.cfg.num_steps + 1) if self.cfg.chain_reduction == "mean" else chain_sum

    def sample(self, velocity: VelocityFn, features: torch.Tensor, x0: torch.Tensor, deterministic: bool):
        """Run the chain from x0 [N, C, A]; returns (replay entries, per-element log-prob [N, C, A]).

        Deterministic sampling takes the means (the plain Euler ODE) and scores them under the chain.
        """
        grid = time_grid(self.cfg.num_steps, x0.device)
        chain, logprob = [x0], gaussian_log_prob(x0, torch.zeros_like(x0), torch.ones_like(x0))
        for k in range(self.cfg.num_steps):
            mean, std = self._step(velocity, features, chain[-1], grid[k].expand(x0.shape[0]))
            x_next = mean if deterministic else mean + std * torch.randn_like(mean)
            logprob = logprob + gaussian_log_prob(x_next, mean, std)
            chain.append(x_next)
        return {"chain": torch.stack(chain, dim=1)}, self._reduce(logprob)  # chain [N, K+1, C, A]

    def log_prob(
        self, velocity: VelocityFn, features: torch.Tensor, replay
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recompute the stored chain's per-element log-prob [N, C, A] and the mean step entropy [N]."""
        chain = replay["chain"]  # [N, K+1, C, A]
        grid = time_grid(self.cfg.num_steps, chain.device)
        x0 = chain[:, 0]
        logprob = gaussian_log_prob(x0, torch.zeros_like(x0), torch.ones_like(x0))
        entropy = torch.zeros(chain.shape[0], device=chain.device)
        for k in range(self.cfg.num_steps):
            mean, std = self._step(velocity, features, chain[:, k], grid[k].expand(chain.shape[0]))
            logprob = logprob + gaussian_log_prob(chain[:, k + 1], mean, std)
            entropy = entropy + gaussian_entropy(std).mean((-2, -1))
        return self._reduce(logprob), entropy / self.cfg.num_steps
