"""Metrics of every iteration: a progress bar, metrics.jsonl, TensorBoard, and a learning-curve PNG."""

from __future__ import annotations

import json
from pathlib import Path

from tqdm import tqdm

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


class MetricsLogger:
    """Appends one JSON line per iteration (survives crashes) and mirrors it to TensorBoard."""

    def __init__(self, run_dir: Path, total: int, start: int = 0, tensorboard: bool = True) -> None:
        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        self.bar = tqdm(total=total, initial=start, desc="train", unit="it", dynamic_ncols=True)
        self.shown: dict[str, float] = {}

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"iteration": iteration, **metrics}) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, iteration)
            self.writer.flush()
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
