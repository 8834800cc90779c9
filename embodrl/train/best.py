"""A run's best policy: the weights of its best evaluation, kept in checkpoints/best beside checkpoints/last.

RL curves are noisy and a policy can get worse late in a run, so the last weights are not always the ones
to deploy. The best is chosen on the evaluation episodes (initial states 0..E-1), so its score there is
optimistic: a maximum over many evaluations with sampling noise. The runner therefore plays the best
policy once more on E held-out initial states (E..2E-1), a fair figure to set beside the last policy's
final evaluation (which no choice biased).
"""

from __future__ import annotations

import json
from pathlib import Path

from embodrl.train.checkpointing import INFO_FILE, save_checkpoint

BEST = "checkpoints/best"
BEST_EVAL_FILE = "best_eval.json"


class BestCheckpoint:
    """Keeps `run_dir/checkpoints/best` (policy/ + info.json) at the best evaluation so far: highest
    success, then highest return. A resumed run continues from the best already on disk."""

    def __init__(self, run_dir: Path) -> None:
        self.directory = run_dir / BEST
        info = self.directory / INFO_FILE
        self.info: dict | None = json.loads(info.read_text()) if info.is_file() else None

    @property
    def iteration(self) -> int | None:
        return None if self.info is None else self.info["iteration"]

    def consider(self, iteration: int, metrics: dict[str, float], policy) -> bool:
        """Save `policy` as the best when `metrics` (eval/success, eval/return) beat the best so far."""
        score = (metrics["eval/success"], metrics["eval/return"])
        if self.info is not None and score <= (self.info["eval/success"], self.info["eval/return"]):
            return False
        info = {"iteration": iteration, "eval/success": score[0], "eval/return": score[1]}
        save_checkpoint(self.directory, policy, info=info)
        self.info = info
        return True
