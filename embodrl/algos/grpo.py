"""GRPO advantages: each trajectory's return normalized within its group of G envs; no critic.

Env i belongs to group i // G; the engine resets the G members of a group to the same initial state
(`VecEnv.reset_to`) at the start of the rollout window. Within the [T, N] window:
- A trajectory is one finished episode (it ends with terminated or truncated inside the window);
  its return is the undiscounted sum of its rewards, its success whether `success` was set at any step.
- The k-th episode of every member of group g forms the sample set (g, k). k = 0 is the episode
  started by reset_to; k >= 1 compares like with like only if auto-resets are synchronized per group.
- A set is used only if all G members finished their k-th episode in the window: otherwise its
  members are masked out (an unfinished tail is never scored, and partial groups would favour
  short episodes). Episodes must start at the window's start (the engine calls reset_to there).
- A = (R - mean_group(R)) / (std_group(R) + eps), unbiased std, broadcast to every decision of the
  trajectory. With `success_range` = (lo, hi), sets whose success rate is outside [lo, hi] are masked:
  all-success and all-fail groups have A = 0 and carry no signal.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from embodrl.algos.advantage import AdvantageOut, episode_index, segment_lengths
from embodrl.algos.config import AlgoConfig
from embodrl.errors import ConfigError


def compute_grpo(
    rewards: torch.Tensor,  # [T, N, C] per executed action (or [T, N] per decision)
    terminated: torch.Tensor,  # [T, N] bool
    truncated: torch.Tensor,  # [T, N] bool
    success: torch.Tensor,  # [T, N] bool
    group_size: int,
    success_range: tuple[float, float] | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Advantages, trajectory returns and the valid-sample mask, each [T, N] (see module doc)."""
    num_steps, num_envs = terminated.shape
    if num_envs % group_size:
        raise ConfigError(
            f"env.num_envs={num_envs} must be a multiple of algo.group_size={group_size} for GRPO"
        )
    reward = rewards.sum(-1) if rewards.dim() == 3 else rewards  # [T, N]
    done = terminated | truncated
    episode = episode_index(done)  # [T, N]; the unfinished tail has index == episodes finished
    slots = num_steps + 1  # an env has at most T finished episodes plus one tail
    ids = (episode + torch.arange(num_envs, device=done.device) * slots).flatten()  # [T*N]

    # Per (env, episode) statistics, laid out [N, slots].
    returns = torch.zeros(num_envs * slots, dtype=reward.dtype, device=reward.device)
    returns = returns.index_add(0, ids, reward.flatten()).view(num_envs, slots)
    successes = torch.zeros(num_envs * slots, device=done.device)
    succeeded = successes.index_add(0, ids, success.flatten().float()).view(num_envs, slots) > 0
    finished = torch.arange(slots, device=done.device) < done.sum(0)[:, None]  # [N, slots]

    num_groups = num_envs // group_size
    grouped = returns.view(num_groups, group_size, slots)
    mean = grouped.mean(1, keepdim=True)
    std = grouped.std(1, keepdim=True)  # unbiased, as in the references
    advantages = ((grouped - mean) / (std + eps)).view(num_envs, slots)
    keep = finished.view(num_groups, group_size, slots).all(1)  # [groups, slots]
    if success_range is not None:
        rate = succeeded.view(num_groups, group_size, slots).float().mean(1)
        keep &= (rate >= success_range[0]) & (rate <= success_range[1])
    keep = keep.repeat_interleave(group_size, dim=0)  # [N, slots]

    env = torch.arange(num_envs, device=done.device).expand(num_steps, num_envs)
    mask = keep[env, episode]
    zeros = torch.zeros_like(reward)
    return torch.where(mask, advantages[env, episode], zeros), returns[env, episode], mask


def grpo_advantages(rollout: TensorDict, last_value: torch.Tensor | None, cfg: AlgoConfig) -> AdvantageOut:
    """The "grpo" estimator; `last_value` is ignored (no critic)."""
    advantages, returns, mask = compute_grpo(
        rollout["reward"],
        rollout["terminated"],
        rollout["truncated"],
        rollout["success"],
        cfg.group_size,
        cfg.grpo_success_range,
        cfg.eps,
    )
    return AdvantageOut(
        advantages, returns, mask, segment_lengths(rollout["terminated"] | rollout["truncated"])
    )
