"""Generalized advantage estimation over decisions (one decision = one action chunk), with auto-resets.

Decision t sees obs s_t with value V_t = V(s_t), executes a chunk of C actions of which
`steps_executed` k_t ran before the episode ended (k_t = C otherwise) and earns rewards r_{t,j}.
Per-decision reward and discount:
    reward_type "chunk":  R_t = sum_j r_{t,j},              D_t = gamma
    reward_type "action": R_t = sum_{j<k_t} gamma^j r_{t,j}, D_t = gamma^{k_t}
so "action" discounts every executed env step exactly, while values stay per decision (a semi-MDP).
The value after decision t:
    terminated_t: 0 (no bootstrap)
    truncated_t:  bootstrap_value_t = V(final_obs_t) (the env auto-reset; s_{t+1} is a new episode)
    otherwise:    V_{t+1}, or `last_value` = V(s_T) after the window's last decision
    delta_t = R_t + D_t * V_next_t - V_t
    A_t     = delta_t + D_t * lambda * (1 - done_t) * A_{t+1},   A_T = 0
    returns = A + V
The (1 - done_t) factor stops the recursion at every episode end, so no value leaks across an auto-reset.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from embodrl.algos.advantage import AdvantageOut, segment_lengths
from embodrl.algos.config import AlgoConfig


def decision_rewards(
    rewards: torch.Tensor, steps_executed: torch.Tensor, gamma: float, reward_type: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-decision reward R_t and discount D_t [T, N] from per-action rewards [T, N, C] (see module doc)."""
    if reward_type == "chunk":
        return rewards.sum(-1), torch.full_like(rewards[..., 0], gamma)
    offsets = torch.arange(rewards.shape[-1], device=rewards.device)  # [C]
    executed = offsets < steps_executed[..., None]  # [T, N, C]
    weights = torch.where(executed, gamma ** offsets.to(rewards.dtype), torch.zeros_like(rewards))
    return (rewards * weights).sum(-1), gamma ** steps_executed.to(rewards.dtype)


def compute_gae(
    rewards: torch.Tensor,  # [T, N, C] per executed action, zeros after an episode's end
    values: torch.Tensor,  # [T, N] V(s_t)
    last_value: torch.Tensor,  # [N] V(s_T) after the last decision
    terminated: torch.Tensor,  # [T, N] bool
    truncated: torch.Tensor,  # [T, N] bool
    bootstrap_value: torch.Tensor,  # [T, N] V(final_obs), read where truncated
    steps_executed: torch.Tensor,  # [T, N] int
    gamma: float,
    gae_lambda: float,
    reward_type: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns [T, N] by the recursion in the module docstring."""
    reward, discount = decision_rewards(rewards, steps_executed, gamma, reward_type)
    next_values = torch.cat([values[1:], last_value[None]], dim=0)
    next_values = torch.where(truncated, bootstrap_value, next_values)
    next_values = torch.where(terminated, torch.zeros_like(next_values), next_values)
    deltas = reward + discount * next_values - values
    carry = discount * gae_lambda * (~(terminated | truncated)).to(values.dtype)
    advantages = torch.empty_like(values)
    running = torch.zeros_like(last_value)
    for t in reversed(range(values.shape[0])):
        running = deltas[t] + carry[t] * running
        advantages[t] = running
    return advantages, advantages + values


def gae_advantages(rollout: TensorDict, last_value: torch.Tensor | None, cfg: AlgoConfig) -> AdvantageOut:
    """The "gae" estimator: every decision of the window is a valid sample."""
    if last_value is None:
        raise ValueError("GAE needs last_value, V of the observation after the window's last decision")
    done = rollout["terminated"] | rollout["truncated"]
    advantages, returns = compute_gae(
        rollout["reward"],
        rollout["value"],
        last_value,
        rollout["terminated"],
        rollout["truncated"],
        rollout["bootstrap_value"],
        rollout["steps_executed"],
        cfg.gamma,
        cfg.gae_lambda,
        cfg.reward_type,
    )
    return AdvantageOut(advantages, returns, torch.ones_like(done), segment_lengths(done))
