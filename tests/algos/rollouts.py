"""Random rollout windows with terminations, truncations and auto-resets, shared by the estimator tests."""

from __future__ import annotations

import torch
from tensordict import TensorDict


def random_rollout(
    num_steps: int, num_envs: int, chunk: int, seed: int, p_term: float = 0.15, p_trunc: float = 0.1
) -> tuple[TensorDict, torch.Tensor]:
    """A rollout TensorDict [T, N] with the buffer's keys (no obs/replay) and last_value [N]."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_steps, num_envs)
    terminated = torch.rand(shape, generator=gen) < p_term
    truncated = torch.rand(shape, generator=gen) < p_trunc  # sometimes together with terminated
    done = terminated | truncated
    steps = torch.where(done, torch.randint(1, chunk + 1, shape, generator=gen), torch.full(shape, chunk))
    reward = torch.randn(*shape, chunk, generator=gen)
    reward[torch.arange(chunk) >= steps[..., None]] = 0.0
    rollout = TensorDict(
        {
            "reward": reward,
            "value": torch.randn(shape, generator=gen),
            "terminated": terminated,
            "truncated": truncated,
            "success": terminated & (torch.rand(shape, generator=gen) < 0.6),
            "bootstrap_value": torch.where(truncated, torch.randn(shape, generator=gen), 0.0),
            "steps_executed": steps,
        },
        batch_size=shape,
    )
    return rollout, torch.randn(num_envs, generator=gen)
