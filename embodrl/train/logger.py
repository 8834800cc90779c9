"""Metrics of every iteration: a progress bar, metrics.jsonl, TensorBoard, wandb, and a learning-curve PNG."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from embodrl.config import ExperimentConfig, to_dict
from embodrl.errors import UserError

WANDB_ID_FILE = "wandb_run_id"  # in the run folder: a resumed run logs on into the same wandb run

# What the progress bar shows, in order: metric key -> short label.
BAR_FIELDS = {
    "rollout/env_steps_per_s": "sps",
    "rollout/success": "succ",
    "rollout/return": "ret",
    "train/approx_kl": "kl",
    "train/clip_fraction": "clip",
    "sft/loss": "loss",
    "sft/samples_per_s": "samples/s",
    "eval/success": "eval",
}


@dataclass(frozen=True)
class WandbTarget:
    """Where a run logs in Weights & Biases (train.wandb_*), and what it records there."""

    project: str
    entity: str  # "" = the logged-in user's default entity
    group: str  # the experiment's name: its runs side by side
    job_type: str  # "rl" or "sft"
    config: dict[str, Any]  # the resolved experiment config


def wandb_target(cfg: ExperimentConfig, job_type: str) -> WandbTarget | None:
    """The run's wandb target, or None with train.wandb=false."""
    train = cfg.train
    if not train.wandb:
        return None
    return WandbTarget(train.wandb_project, train.wandb_entity, cfg.name, job_type, to_dict(cfg))


def start_wandb(run_dir: Path, target: WandbTarget) -> Any:
    """The wandb run of this run folder: a new one, or after --resume the one it started (its id is kept
    in the folder). Offline machines: WANDB_MODE=offline, then `wandb sync` later."""
    try:
        import wandb
    except ImportError:
        raise UserError(
            "train.wandb=true needs the wandb package: pip install 'embodrl[wandb]' (or train.wandb=false)"
        ) from None
    id_file = run_dir / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.is_file() else None  # None: wandb picks a new one
    run = wandb.init(
        project=target.project,
        entity=target.entity or None,
        group=target.group,
        job_type=target.job_type,
        name=f"{run_dir.parent.name}/{run_dir.name}",
        id=run_id,
        resume="allow" if run_id else None,
        dir=str(run_dir),
        config=target.config,
    )
    id_file.write_text(run.id)
    return run


class MetricsLogger:
    """Appends one JSON line per iteration (survives crashes) and mirrors it to TensorBoard and wandb."""

    def __init__(
        self,
        run_dir: Path,
        total: int,
        start: int = 0,
        tensorboard: bool = True,
        wandb: WandbTarget | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        drop_lines_after(self.path, start)  # a resumed run logs them again
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        self.wandb = start_wandb(run_dir, wandb) if wandb is not None else None
        self.bar = tqdm(total=total, initial=start, desc="train", unit="it", dynamic_ncols=True)
        self.shown: dict[str, float] = {}

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"iteration": iteration, **metrics}) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, iteration)
            self.writer.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=iteration)
        self.shown.update({label: metrics[key] for key, label in BAR_FIELDS.items() if key in metrics})
        self.bar.set_postfix({k: f"{v:.3g}" for k, v in self.shown.items()}, refresh=False)
        self.bar.update(1)

    def advance(self) -> None:
        """Count a step that logged nothing."""
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def drop_lines_after(path: Path, start: int) -> None:
    """Keep the lines of metrics file `path` up to iteration `start` (a resume point; rewritten atomically):
    those after it came from iterations the checkpoint does not hold."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            if json.loads(line)["iteration"] <= start:
                kept.append(line if line.endswith("\n") else line + "\n")
        except (ValueError, KeyError, TypeError):  # a line cut short by a kill
            continue
    if kept != lines:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(kept))
        tmp.replace(path)


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.is_file() else []


def plot_learning_curve(run_dir: Path, out: Path | None = None) -> Path | None:
    """success (rollout and eval) against env steps, from metrics.jsonl; None when nothing was logged."""
    rows = read_metrics(run_dir)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("rollout/success", "rollout (stochastic)"), ("eval/success", "eval (deterministic)")):
        points = [(r["rollout/env_steps"], r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o" if key.startswith("eval") else None, label=label)
    ax.set_xlabel("env steps")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    out = out or run_dir / "learning_curve.png"
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
