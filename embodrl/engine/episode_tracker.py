"""Running return/length per env and the outcomes of the episodes that finished during a rollout."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class EpisodeTracker:
    """Running return/length per env and the outcomes of episodes finished since the last `pop`."""

    returns: torch.Tensor
    lengths: torch.Tensor
    finished: list[tuple[float, int, bool]] = field(default_factory=list)

    @classmethod
    def zeros(cls, num_envs: int) -> EpisodeTracker:
        return cls(torch.zeros(num_envs), torch.zeros(num_envs, dtype=torch.long))

    def record(
        self, reward: torch.Tensor, steps: torch.Tensor, done: torch.Tensor, success: torch.Tensor
    ) -> None:
        self.returns += reward.sum(-1).cpu()
        self.lengths += steps.cpu()
        for i in done.cpu().nonzero().flatten().tolist():
            self.finished.append((float(self.returns[i]), int(self.lengths[i]), bool(success[i])))
            self.returns[i], self.lengths[i] = 0.0, 0

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
