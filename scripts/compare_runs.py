"""Plot several RL runs' success against RL wall-clock minutes (or env steps, --x env-steps) on one figure:
the rollout success (stochastic, a moving mean over --window iterations) as a line, the deterministic
evaluations as markers; each --panel KEY adds a panel below with that metric's moving mean (e.g.
rollout/intervention_rate).

    python scripts/compare_runs.py --out docs/img/curves.png "seed 0=runs/exp/a/RUN" "seed 1=runs/exp/b/RUN"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from embodrl.train.logger import read_metrics

# --x choice -> (metric, divisor, axis label)
AXES = {
    "minutes": ("time/wall", 60, "RL wall-clock (minutes)"),
    "env-steps": ("rollout/env_steps", 1000, "env steps (thousands)"),
}


def moving_mean(values: list[float], window: int) -> list[float]:
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
        for i in range(len(values))
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR", help="a label and a run folder")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--window", type=int, default=10, help="iterations in the rollout moving mean")
    parser.add_argument("--title", default="", help="figure title")
    parser.add_argument(
        "--panel", action="append", default=[], metavar="KEY", help="a metric drawn in a panel of its own"
    )
    parser.add_argument(
        "--x", choices=tuple(AXES), default="minutes", help="the horizontal axis (default: minutes)"
    )
    args = parser.parse_args(argv)
    key, scale, x_label = AXES[args.x]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1 + len(args.panel), 1, figsize=(7, 4 + 2.5 * len(args.panel)), sharex=True, squeeze=False
    )
    ax, panels = axes[0, 0], [a for (a,) in axes[1:]]
    for spec in args.runs:
        label, sep, folder = spec.partition("=")
        rows = read_metrics(Path(folder)) if sep else []
        if not rows:
            print(f"compare_runs: {spec!r} is not LABEL=RUN_DIR with a metrics.jsonl", file=sys.stderr)
            return 2
        if any(key not in r for r in rows):
            print(f"compare_runs: {folder} logs no {key} for --x {args.x}", file=sys.stderr)
            return 2
        xs = [r[key] / scale for r in rows]
        (line,) = ax.plot(xs, moving_mean([r["rollout/success"] for r in rows], args.window), label=label)
        evals = [(r[key] / scale, r["eval/success"]) for r in rows if "eval/success" in r]
        if evals:
            ax.plot(*zip(*evals, strict=True), "o", color=line.get_color(), label=f"{label}: evaluation")
        for metric, panel in zip(args.panel, panels, strict=True):
            points = [(r[key] / scale, r[metric]) for r in rows if metric in r]
            if points:
                at, values = zip(*points, strict=True)
                panel.plot(at, moving_mean(list(values), args.window), color=line.get_color(), label=label)
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    for metric, panel in zip(args.panel, panels, strict=True):
        panel.set_ylabel(metric)
    for a in (ax, *panels):
        a.grid(alpha=0.3)
    axes[-1, 0].set_xlabel(x_label)
    if args.title:
        ax.set_title(args.title)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
