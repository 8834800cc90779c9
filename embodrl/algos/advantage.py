"""What every advantage estimator returns, episode bookkeeping in a [T, N] window, dispatch by name."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from embodrl.algos import registry
from embodrl.algos.config import AlgoConfig


@dataclass
class AdvantageOut:
    """Per-decision training targets for one rollout window."""

    advantages: torch.Tensor  # [T, N] float
    returns: torch.Tensor  # [T, N] float: value targets (GAE) or the trajectory's return (GRPO)
    mask: torch.Tensor  # [T, N] bool: samples that enter the loss
    traj_length: torch.Tensor  # [T, N] float: decisions in the window of the sample's trajectory

    def to_tensordict(self) -> TensorDict:
        """The four tensors under their own names, to merge into the rollout TensorDict [T, N]."""
        return TensorDict(
            {
                "advantages": self.advantages,
                "returns": self.returns,
                "mask": self.mask,
                "traj_length": self.traj_length,
            },
            batch_size=self.advantages.shape,
        )


def compute_advantages(rollout: TensorDict, last_value: torch.Tensor | None, cfg: AlgoConfig) -> AdvantageOut:
    """Run the estimator named by `cfg.advantage`, then normalize over the rollout's valid samples if
    `cfg.normalize_advantages` is "rollout" (PPO normalizes "minibatch" itself, per minibatch)."""
    out = registry.get("advantage", cfg.estimator)(rollout, last_value, cfg)
    if cfg.normalize_advantages == "rollout":
        out.advantages = normalize_advantages(out.advantages, out.mask, cfg.eps)
    return out


def normalize_advantages(advantages: torch.Tensor, mask: torch.Tensor | None, eps: float) -> torch.Tensor:
    """(A - mean) / (std + eps) over the valid entries; invalid entries become 0. mask None: all valid
    (the same numbers without the masking ops, which cost a minibatch of a small MLP ~5%)."""
    valid = advantages if mask is None else advantages[mask]
    normalized = advantages
    if valid.numel() >= 2:  # else no spread to normalize by
        normalized = (advantages - valid.mean()) / (valid.std() + eps)
    return normalized if mask is None else torch.where(mask, normalized, torch.zeros_like(normalized))


def episode_index(done: torch.Tensor) -> torch.Tensor:
    """[T, N] bool -> [T, N] int64: how many episodes of that env ended before this step in the window."""
    done = done.long()
    return done.cumsum(0) - done


def segment_lengths(done: torch.Tensor) -> torch.Tensor:
    """[T, N] bool -> [T, N] float: steps in the window that share this step's env and episode."""
    num_steps, num_envs = done.shape
    ids = episode_index(done) + torch.arange(num_envs, device=done.device) * (num_steps + 1)  # [T, N]
    counts = torch.bincount(ids.flatten(), minlength=num_envs * (num_steps + 1))
    return counts[ids].float()
