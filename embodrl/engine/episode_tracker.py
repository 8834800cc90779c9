"""Running return/length per env and the outcomes of the episodes that finished during a rollout."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from embodrl.parallel.distributed import sum_over_ranks

OUTCOMES = ("return", "length", "success")  # the per-episode means `pop` returns, then the env's flags


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
    finished: list[dict[str, float]] = field(default_factory=list)  # OUTCOMES and flags per episode
    flag_names: tuple[str, ...] = ()  # the env's episode flags (StepResult.episode_flags), as recorded

    @classmethod
    def zeros(cls, num_envs: int, episode_limit: int | None = None) -> EpisodeTracker:
        return cls(torch.zeros(num_envs), torch.zeros(num_envs, dtype=torch.long), episode_limit)

    def record_rollout(
        self,
        reward: torch.Tensor,
        steps: torch.Tensor,
        done: torch.Tensor,
        success: torch.Tensor,
        flags: TensorDict | None = None,
    ) -> None:
        """Count a rollout's decisions: reward [T, N, C], steps executed, done, success and the episode
        flags [T, N] (read where an episode ends, as success).

        Once per rollout rather than per decision: at one env the per-decision sums cost as much as
        the buffer's copy; here only the few decisions that end an episode cost a Python step.
        """
        step_returns, steps, success = reward.sum(-1).cpu(), steps.cpu(), success.cpu()
        flags = {} if flags is None else {name: flag.cpu() for name, flag in flags.items()}
        self.flag_names = tuple(flags)
        last_start = None  # the last decision from which a whole episode fits (a chunk stops at its end)
        if self.episode_limit is not None:
            last_start = reward.shape[0] - math.ceil(self.episode_limit / reward.shape[-1])
        start = torch.zeros(step_returns.shape[1], dtype=torch.long)  # the running episode's first decision
        for t, i in done.cpu().nonzero().tolist():  # in time order
            ret = self.returns[i] + step_returns[start[i] : t + 1, i].sum()
            length = self.lengths[i] + steps[start[i] : t + 1, i].sum()
            if last_start is None or start[i] <= last_start:
                outcome = {"return": float(ret), "length": int(length), "success": bool(success[t, i])}
                self.finished.append(outcome | {name: bool(flag[t, i]) for name, flag in flags.items()})
            self.returns[i], self.lengths[i], start[i] = 0.0, 0, t + 1
        running = torch.arange(step_returns.shape[0])[:, None] >= start  # [T, N]: episodes still going
        self.returns += (step_returns * running).sum(0)
        self.lengths += (steps * running).sum(0)

    def pop(self) -> dict[str, float]:
        """Mean return, length, success and flags of the finished episodes, then forget them. Without any,
        every mean is 0: the same keys on every rank, for `mean_over_ranks`."""
        finished, self.finished = self.finished, []
        n = len(finished)
        means = {k: sum(e[k] for e in finished) / n if n else 0.0 for k in (*OUTCOMES, *self.flag_names)}
        return {"episodes": float(n), **means}


def mean_over_ranks(outcomes: dict[str, float]) -> dict[str, float]:
    """`pop`'s outcomes of every rank's episodes: counts summed, means weighted by them (unchanged in one
    process); without any finished episode, only the count."""
    n = outcomes["episodes"]
    totals = sum_over_ranks({k: v if k == "episodes" else v * n for k, v in outcomes.items()})
    if not totals["episodes"]:
        return {"episodes": 0.0}
    return {k: v if k == "episodes" else v / totals["episodes"] for k, v in totals.items()}
