"""What the SFT and RL runners share: the run folder's checkpoints and the final evaluation that ends a run.

Each runner keeps its own loop: RL iterations run on every torchrun rank (fsdp gathers, the schedule's
weights and pauses), SFT steps log every few steps; what they do alike lives here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from embodrl.config import ExperimentConfig
from embodrl.sims.base import VecEnv
from embodrl.sims.registry import make_env
from embodrl.train.best import BestCheckpoint
from embodrl.train.checkpointing import (
    LAST,
    POLICY_DIR,
    keep_copy,
    recover_checkpoint,
    restore_checkpoint,
    rng_state,
    save_checkpoint,
)
from embodrl.train.episodes import EpisodeResults
from embodrl.train.evaluation import evaluate_policy
from embodrl.train.logger import MetricsLogger, wandb_target

FINAL_EVAL_FILE = "final_eval.json"  # written when a run finishes

log = logging.getLogger(__name__)


def warn_unsaved(run_dir: Path, what: str, number: int) -> None:
    """Say that a run stopped inside `what` `number` (a second Ctrl-C, a crash), which is not saved: its
    state is half updated, so checkpoints/last keeps the last finished one for --resume."""
    log.warning(
        "stopped inside %s %d, which is not saved; --resume %s continues from the last checkpoint",
        what,
        number,
        run_dir,
    )


class Runner(ABC):
    """A training run in `run_dir`: checkpoints/last (the policy, the loop's state, the RNG states) to resume
    from, checkpoints/best when kept, and final_eval.json at the end.

    A subclass sets `cfg`, `run_dir`, `env` and `best` in its constructor, and says how it plays the
    evaluation episodes from an initial state on (`play_from`)."""

    cfg: ExperimentConfig
    run_dir: Path
    env: VecEnv
    best: BestCheckpoint | None

    @abstractmethod
    def play_from(self, policy: nn.Module, first_state_id: int = 0) -> EpisodeResults:
        """`policy`'s evaluation episodes from initial state `first_state_id` on."""

    def play_rl_evaluation(
        self,
        policy: nn.Module,
        first_state_id: int,
        record: int,
        video_dir: Path | None,
        own_env: bool = False,
    ) -> EpisodeResults:
        """An RL run's evaluation episodes (train.eval_episodes from `first_state_id`, the first `record` as
        videos into `video_dir`): in the training env, or in a fresh env of the simulator when
        train.eval_envs asks another size or `own_env` (the training env is busy or not the simulator's)."""
        cfg = self.cfg
        num_envs = cfg.train.eval_envs or cfg.env.num_envs
        eval_env = self.env
        if own_env or num_envs != self.env.num_envs:
            eval_env = make_env(dataclasses.replace(cfg.env, num_envs=num_envs), device=cfg.device)
        try:
            return evaluate_policy(
                policy,
                eval_env,
                cfg.train.eval_episodes,
                record,
                video_dir,
                seed=cfg.seed,
                first_state_id=first_state_id,
            )
        finally:
            if eval_env is not self.env:
                eval_env.close()

    def open_logger(self, kind: str, total: int, start: int) -> MetricsLogger:
        """The run's metrics logger (metrics.jsonl, TensorBoard, wandb) for a `kind` run ("rl", "sft") that
        counts to `total` and continues from `start`."""
        return MetricsLogger(
            self.run_dir, total, start, self.cfg.train.tensorboard, wandb_target(self.cfg, kind)
        )

    def resumable(self) -> bool:
        """Whether checkpoints/last holds a checkpoint to resume from, once an interrupted save is
        recovered; a run stopped before its first save has none and starts over (with a warning), as the
        uninterrupted run did."""
        recover_checkpoint(self.run_dir / LAST)
        if (self.run_dir / LAST).is_dir():
            return True
        log.warning(
            "%s has no checkpoint yet (stopped before its first save): starting it over", self.run_dir
        )
        return False

    def save_last(
        self, policy: nn.Module, state: dict, generators: dict[str, torch.Generator], number: int
    ) -> Path:
        """Write checkpoints/last: `policy`, the loop's `state` and the RNG states a resume continues with;
        with train.keep_checkpoints, also kept as checkpoints/<number>/ (iteration or step)."""
        last = save_checkpoint(self.run_dir / LAST, policy, {**state, "rng": rng_state(generators)})
        keep_copy(last, number, self.cfg.train.keep_checkpoints)
        return last

    def restore_last(
        self,
        policy: nn.Module,
        generators: dict[str, torch.Generator],
        load_weights: Callable[[dict[str, torch.Tensor]], None] | None = None,
    ) -> dict:
        """Load checkpoints/last into `policy` and `generators` (the weights through `load_weights` when
        given); returns the loop's state."""
        return restore_checkpoint(self.run_dir / LAST, policy, self.cfg.device, generators, load_weights)

    def conclude(
        self, summary: dict, count: int, metrics: dict[str, float], policy: nn.Module, episodes: int
    ) -> dict:
        """End the run with its final evaluation: `summary` into final_eval.json; with a best checkpoint, the
        last `policy` (at `count`, scored `metrics`) competes for it, and when an earlier one stays best,
        both play `episodes` held-out episodes (BestCheckpoint.evaluate_held_out). Returns `summary` with
        the best/* entries."""
        (self.run_dir / FINAL_EVAL_FILE).write_text(json.dumps(summary, indent=2))
        if self.best is None:
            return summary
        self.best.consider(count, metrics, policy)
        held_out = self.best.evaluate_held_out(
            count,
            self.run_dir / LAST / POLICY_DIR,
            episodes,
            self.env.num_init_states,
            self.play_from,
            self.cfg.device,
        )
        return {**summary, **held_out}
