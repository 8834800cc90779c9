"""Running statistics for RL from scratch: observation normalization and reward scaling (CleanRL's details).

- `RunningMeanStd`: mean/var over every sample seen, merged batch by batch (Chan et al.'s parallel
  algorithm, as SB3's and gymnasium's RunningMeanStd; starts at mean 0, var 1, count 1e-4 like them).
- `RunningObsNormalization`: running stats of the rollouts' `state`/`privileged` written into the
  policy's own normalizers after each update, so eval, deploy and serve reuse them from the
  checkpoint. Updated between iterations only: the update recomputes log-probs with the normalizer the
  rollout acted with, so the first minibatch's ratio stays exactly 1.
- `RewardScaler`: SB3 VecNormalize's reward normalization (gymnasium NormalizeReward in CleanRL):
  per env step, ret = gamma * ret + r, the stats absorb ret, r is divided by sqrt(var + eps) and
  clipped; ret restarts at every episode end. Applied to a finished rollout (nothing in the rollout
  depends on the scaled reward), with each step scaled by the stats as they stood after that step,
  exactly as the per-step wrapper would.
Under data parallelism with per-rank rollouts, `reduce` sums the moments over ranks, so every rank
holds the statistics of all ranks' samples (as one vectorized env of world x N envs would).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from embodrl.errors import UserError
from embodrl.obs_keys import VECTOR_KEYS

Reduce = Callable[[torch.Tensor], torch.Tensor]  # float64 tensor -> its elementwise sum over ranks


class RunningMeanStd:
    """Mean and (population) variance [*shape] of every sample merged so far, in float64."""

    def __init__(self, shape: tuple[int, ...] = (), count: float = 1e-4) -> None:
        self.mean = torch.zeros(shape, dtype=torch.float64)
        self.var = torch.ones(shape, dtype=torch.float64)
        self.count = count

    def update(self, batch: torch.Tensor, reduce: Reduce | None = None) -> None:
        """Merge a batch [B, *shape] (with every rank's batch when `reduce` sums over ranks)."""
        batch = batch.detach().to("cpu", torch.float64)
        count, total, squares = float(batch.shape[0]), batch.sum(0), batch.square().sum(0)
        if reduce is not None:
            packed = reduce(
                torch.cat([torch.tensor([count], dtype=torch.float64), total.flatten(), squares.flatten()])
            )
            count, (total, squares) = float(packed[0]), packed[1:].view(2, *total.shape).unbind(0)
        mean = total / count
        self.merge(mean, (squares / count - mean.square()).clamp_min(0.0), count)

    def merge(self, mean: torch.Tensor, var: torch.Tensor, count: float) -> None:
        """Merge the moments of `count` samples (Chan et al.: exact pooled mean and variance)."""
        total = self.count + count
        delta = mean - self.mean
        m2 = self.var * self.count + var * count + delta.square() * self.count * count / total
        self.mean = self.mean + delta * count / total
        self.var, self.count = m2 / total, total

    def state_dict(self) -> dict:
        return {"mean": self.mean.clone(), "var": self.var.clone(), "count": self.count}

    def load_state_dict(self, state: Mapping) -> None:
        self.mean, self.var, self.count = state["mean"].clone(), state["var"].clone(), state["count"]


class RunningObsNormalization:
    """Running mean/std of the observed vector keys, copied into the policy's mean_std normalizers."""

    def __init__(self, normalizers: Mapping[str, nn.Module]) -> None:
        self.normalizers = {key: norm for key, norm in normalizers.items() if key in VECTOR_KEYS}
        if not self.normalizers:
            raise UserError(
                "algo.obs_normalization=true, but the policy reads no state/privileged vector to normalize"
            )
        for key, norm in self.normalizers.items():
            if norm.mode != "mean_std":
                raise UserError(
                    f"algo.obs_normalization=true keeps a running mean/std, but the policy normalizes "
                    f"{key!r} by {norm.mode!r}; set policy.state_normalization=mean_std"
                )
        self.stats = {key: RunningMeanStd((norm.dim,)) for key, norm in self.normalizers.items()}

    def update(self, obs: TensorDict, reduce: Reduce | None = None) -> None:
        """Absorb a rollout's observations [T, N] (every rank's, with `reduce`); write mean/std into the
        normalizers."""
        for key, stats in self.stats.items():
            stats.update(obs[key].reshape(-1, stats.mean.shape[0]), reduce)  # [T*N, D]
            self.normalizers[key].set_stats({"mean": stats.mean, "std": stats.var.sqrt()})

    def state_dict(self) -> dict:
        return {key: stats.state_dict() for key, stats in self.stats.items()}

    def load_state_dict(self, state: Mapping) -> None:
        for key, stats in self.stats.items():
            stats.load_state_dict(state[key])


class RewardScaler:
    """Divides rewards by the running std of the discounted return (module docstring), state kept across
    rollouts: the running return of unfinished episodes and the return statistics."""

    def __init__(self, gamma: float, clip: float, eps: float = 1e-8) -> None:
        self.gamma, self.clip, self.eps = gamma, clip, eps
        self.stats = RunningMeanStd()
        self.returns: torch.Tensor | None = None  # [N] float64, discounted return of the running episodes

    def scale(
        self,
        reward: torch.Tensor,  # [T, N, C] per executed env step, zeros after an episode's end
        steps_executed: torch.Tensor,  # [T, N] int
        done: torch.Tensor,  # [T, N] bool: the episode ended inside decision t
        continues: bool,  # the rollout continues the previous rollout's episodes (else they restart)
        reduce: Reduce | None = None,
    ) -> torch.Tensor:
        """The scaled rewards [T, N, C] (float32, zeros where no step was executed)."""
        num_steps, num_envs, chunk = reward.shape
        # env steps in time order: [T*C, N]
        r = reward.detach().to("cpu", torch.float64).transpose(1, 2).reshape(-1, num_envs)
        executed = torch.arange(chunk) < steps_executed.cpu()[..., None]  # [T, N, C]
        executed = executed.transpose(1, 2).reshape(-1, num_envs)
        ends = torch.zeros(num_steps, chunk, num_envs, dtype=torch.bool)
        ends[:, -1] = done.cpu()  # steps after the episode's end are not executed, so the chunk's end will do
        ends = ends.reshape(-1, num_envs)
        if self.returns is None or not continues:
            self.returns = torch.zeros(num_envs, dtype=torch.float64)
        # the recursion in numpy: per-step torch calls cost ~5x more at the small N of MuJoCo benchmarks
        ret, r_np, live, end = self.returns.numpy().copy(), r.numpy(), executed.numpy(), ends.numpy()
        returns_np = np.zeros_like(r_np)
        for k in range(r_np.shape[0]):
            ret = np.where(live[k], ret * self.gamma + r_np[k], ret)
            returns_np[k] = ret
            ret = np.where(end[k], 0.0, ret)
        self.returns, returns = torch.from_numpy(ret), torch.from_numpy(returns_np)
        # The stats after each step k: the pooled moments of the prior and every return up to k.
        weight = executed.double()
        moments = torch.stack([weight.sum(1), (returns * weight).sum(1), (returns.square() * weight).sum(1)])
        if reduce is not None:  # [3, T*C]: every rank's env steps k are merged at step k
            moments = reduce(moments)
        prior = self.stats
        counts = prior.count + moments[0].cumsum(0)  # [T*C]
        sums = prior.count * prior.mean + moments[1].cumsum(0)
        squares = prior.count * (prior.var + prior.mean.square()) + moments[2].cumsum(0)
        means = sums / counts
        variances = (squares / counts - means.square()).clamp_min(0.0)
        self.stats.mean, self.stats.var, self.stats.count = means[-1], variances[-1], float(counts[-1])
        scaled = (r / (variances[:, None] + self.eps).sqrt()).clamp(-self.clip, self.clip)
        scaled = torch.where(executed, scaled, torch.zeros_like(scaled))
        return scaled.reshape(num_steps, chunk, num_envs).transpose(1, 2).to(reward.device, reward.dtype)

    def state_dict(self) -> dict:
        return {"stats": self.stats.state_dict(), "returns": self.returns}

    def load_state_dict(self, state: Mapping) -> None:
        self.stats.load_state_dict(state["stats"])
        self.returns = state["returns"]
