"""Running return/length per env and the outcomes of the episodes that finished during a rollout."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from embodrl.parallel.distributed import sum_over_ranks

OUTCOMES = ("return", "length", "success")  # the per-episode means `pop` returns besides the count


@dataclass
class EpisodeTracker:
    """Running return/length per env and the outcomes of episodes finished since the last `pop`."""

    returns: torch.Tensor
    lengths: torch.Tensor
    # Set (to the env's max_episode_steps) for rollouts that reset every env at their start. Such a
    # rollout drops the episodes still running at its end, and those are the long ones (a failure runs
    # to the time limit), so counting only the episodes that did end would overstate success: an
    # episode then counts only if it began early enough to end inside the rollout whatever happens.
    # None: every episode counts (rollouts that carry episodes over drop none).
    episode_limit: int | None = None
    finished: list[tuple[float, int, bool]] = field(default_factory=list)

    @classmethod
    def zeros(cls, num_envs: int, episode_limit: int | None = None) -> EpisodeTracker:
        return cls(torch.zeros(num_envs), torch.zeros(num_envs, dtype=torch.long), episode_limit)

    def record_rollout(
        self, reward: torch.Tensor, steps: torch.Tensor, done: torch.Tensor, success: torch.Tensor
    ) -> None:
        """Count a rollout's decisions: reward [T, N, C], steps executed, done and success [T, N].

        Once per rollout rather than per decision: at one env the per-decision sums cost as much as
        the buffer's copy; here only the few decisions that end an episode cost a Python step.
        """
        step_returns, steps, success = reward.sum(-1).cpu(), steps.cpu(), success.cpu()
        last_start = None  # the last decision from which a whole episode fits (a chunk stops at its end)
        if self.episode_limit is not None:
            last_start = reward.shape[0] - math.ceil(self.episode_limit / reward.shape[-1])
        start = torch.zeros(step_returns.shape[1], dtype=torch.long)  # the running episode's first decision
        for t, i in done.cpu().nonzero().tolist():  # in time order
            ret = self.returns[i] + step_returns[start[i] : t + 1, i].sum()
            length = self.lengths[i] + steps[start[i] : t + 1, i].sum()
            if last_start is None or start[i] <= last_start:
                self.finished.append((float(ret), int(length), bool(success[t, i])))
            self.returns[i], self.lengths[i], start[i] = 0.0, 0, t + 1
        running = torch.arange(step_returns.shape[0])[:, None] >= start  # [T, N]: episodes still going
        self.returns += (step_returns * running).sum(0)
        self.lengths += (steps * running).sum(0)

    def pop(self) -> dict[str, float]:
        """Mean return, length and success of the finished episodes, then forget them."""
        if not self.finished:
            return {"episodes": 0.0}
        returns, lengths, successes = zip(*self.finished, strict=True)
        self.finished = []
        n = len(returns)
        return {
            "episodes": float(n),
            "return": sum(returns) / n,
            "length": sum(lengths) / n,
            "success": sum(successes) / n,
        }


def mean_over_ranks(outcomes: dict[str, float]) -> dict[str, float]:
    """`pop`'s outcomes of every rank's episodes: counts summed, means weighted by them (unchanged in one
    process)."""
    n = outcomes["episodes"]
    # a rank without finished episodes has no means: it adds zero weight
    totals = sum_over_ranks({"episodes": n, **{k: outcomes[k] * n if n else 0.0 for k in OUTCOMES}})
    if not totals["episodes"]:
        return {"episodes": 0.0}
    return {"episodes": totals["episodes"], **{k: totals[k] / totals["episodes"] for k in OUTCOMES}}
