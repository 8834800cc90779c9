"""A run's best policy: the weights of its best evaluation, kept in checkpoints/best beside checkpoints/last.

RL curves are noisy and a policy can get worse late in a run, so the last weights are not always the ones
to deploy. The best is chosen on the evaluation episodes (initial states 0..E-1), so its score there is
optimistic: a maximum over many evaluations with sampling noise. When the best is not the last policy,
the runner therefore plays both once more on E held-out initial states (E..2E-1): fair figures, on the
same states, for choosing which one to deploy.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

from embodrl.policies.loading import load_policy
from embodrl.train.checkpointing import INFO_FILE, POLICY_DIR, save_checkpoint
from embodrl.train.episodes import EpisodeResults
from embodrl.train.evaluation import summarize

BEST = "checkpoints/best"
BEST_EVAL_FILE = "best_eval.json"

log = logging.getLogger(__name__)


class BestCheckpoint:
    """Keeps `run_dir/checkpoints/best` (policy/ + info.json) at the best evaluation so far: highest
    success, then highest return. A resumed run continues from the best already on disk. `iteration`
    counts what the run counts: RL iterations, SFT steps."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.directory = run_dir, run_dir / BEST
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

    def evaluate_held_out(
        self,
        last_iteration: int,
        last_policy_dir: Path,
        episodes: int,
        num_init_states: int,
        play: Callable[[object, int], EpisodeResults],
        device: str,
    ) -> dict[str, float]:
        """When the best is not the last policy (saved in `last_policy_dir`): `play(policy, first_state_id)`
        both on the `episodes` initial states after the evaluation's, which chose nothing, and write
        best_eval.json. Returns best/* metrics for the run's summary."""
        summary = {"best/iteration": float(self.iteration), "best/success": self.info["eval/success"]}
        if self.iteration == last_iteration:
            return summary
        if 2 * episodes > num_init_states:
            log.warning(
                "no held-out evaluation of the best checkpoint: the env has %d initial states and the "
                "evaluation's %d episodes use half of them or more",
                num_init_states,
                episodes,
            )
            return summary
        held_out = {
            name: summarize(play(load_policy(directory, device=device), episodes))
            for name, directory in (("best", self.directory / POLICY_DIR), ("last", last_policy_dir))
        }
        report = {
            "iteration": self.iteration,
            "last_iteration": last_iteration,
            "checkpoint": str(self.directory / POLICY_DIR),
            "chosen_on": {
                "first_state_id": 0,
                "episodes": episodes,
                "success_rate": self.info["eval/success"],
            },
            "held_out": {"first_state_id": episodes, **held_out},
        }
        (self.run_dir / BEST_EVAL_FILE).write_text(json.dumps(report, indent=2))
        return {
            **summary,
            "best/held_out_success": held_out["best"]["success_rate"],
            "best/last_held_out_success": held_out["last"]["success_rate"],
        }
