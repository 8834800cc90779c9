"""Robustness across policy families and training stages, from `embodrl eval --perturb` reports.

Reads the robustness.json reports of each column (`LABEL=PATH`, e.g.
`flow/RL=runs/robustness/flow_rl/robustness.json`, or `LABEL=PATH+PATH` for a column whose axes were
evaluated in several runs of one checkpoint: their nominal rows must agree), prints a markdown table of
success at one level per axis with the fraction of nominal success it keeps, the smallest such fraction
per column and whether it is at least --keep on every axis, and writes a
heatmap (colour: the fraction of nominal kept; text: success %).

    python benchmarks/robustness_families.py flow/SFT=A/robustness.json flow/RL=B/robustness.json ... \
        --level 2 --plot docs/img/robustness_families.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from embodrl.sims.perturbation import AXES


def load_columns(items: list[str], level: int) -> dict[str, dict[str, float]]:
    """Per column label: success rate of the nominal row ("nominal") and of each axis at `level`."""
    columns: dict[str, dict[str, float]] = {}
    episodes: set[int] = set()
    for item in items:
        label, sep, paths = item.partition("=")
        if not sep:
            raise SystemExit(f"{item}: expected LABEL=PATH/robustness.json[+PATH/robustness.json ...]")
        rates: dict[str, float] = {}
        for path in paths.split("+"):
            report = json.loads(Path(path).read_text())
            episodes.add(report["episodes"])
            for row in report["rows"]:
                if (
                    row["axis"] == "nominal"
                    and rates.get("nominal", row["success_rate"]) != row["success_rate"]
                ):
                    raise SystemExit(f"{label}: the nominal rows of {paths} differ (not one checkpoint?)")
                if row["axis"] == "nominal" or row["level"] == level:
                    rates[row["axis"]] = row["success_rate"]
        columns[label] = rates
    if len(episodes) != 1:
        raise SystemExit(f"the reports have different episode counts: {sorted(episodes)}")
    return columns


def retained(rates: dict[str, float], axis: str) -> float:
    """Success under the axis as a fraction of nominal success (nan without a nominal success)."""
    return rates[axis] / rates["nominal"] if rates["nominal"] > 0 else float("nan")


def markdown(columns: dict[str, dict[str, float]], axes: list[str], level: int, keep: float) -> str:
    labels = list(columns)
    lines = [
        "| axis@level | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
        "| nominal | " + " | ".join(f"{100 * columns[c]['nominal']:.0f}%" for c in labels) + " |",
    ]
    for axis in axes:
        cells = [f"{100 * columns[c][axis]:.0f}% ({retained(columns[c], axis):.2f})" for c in labels]
        lines.append(f"| {axis}@{level} | " + " | ".join(cells) + " |")
    worst = {c: min(retained(columns[c], a) for a in axes) for c in labels}
    lines.append("| smallest fraction kept | " + " | ".join(f"{worst[c]:.2f}" for c in labels) + " |")
    lines.append(
        f"| >= {keep:.0%} kept on every axis | "
        + " | ".join("yes" if worst[c] >= keep else "no" for c in labels)
        + " |"
    )
    return "\n".join(lines)


def heatmap(columns: dict[str, dict[str, float]], axes: list[str], level: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = list(columns)
    rows = ["nominal", *axes]
    kept = np.array([[retained(columns[c], r) for c in labels] for r in rows])
    fig, ax = plt.subplots(figsize=(1.0 * len(labels) + 2.5, 0.5 * len(rows) + 1.8))
    image = ax.imshow(np.clip(kept, 0, 1.2), cmap="RdYlGn", vmin=0, vmax=1.2, aspect="auto")
    for i, r in enumerate(rows):
        for j, c in enumerate(labels):
            ax.text(j, i, f"{100 * columns[c][r]:.0f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), [r if r == "nominal" else f"{r}@{level}" for r in rows], fontsize=8)
    ax.set_title(f"success % (text) and fraction of nominal kept (colour), level {level}", fontsize=9)
    fig.colorbar(image, ax=ax, label="success / nominal success")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "reports", nargs="+", help="LABEL=PATH/robustness.json[+PATH/robustness.json ...], one per column"
    )
    parser.add_argument("--level", type=int, default=2, help="the level of every axis (default 2)")
    parser.add_argument("--keep", type=float, default=0.8, help="target fraction of nominal (default 0.8)")
    parser.add_argument("--plot", type=Path, help="heatmap PNG to write")
    args = parser.parse_args()
    columns = load_columns(args.reports, args.level)
    axes = sorted((a for a in next(iter(columns.values())) if a != "nominal"), key=list(AXES).index)
    missing = [(c, a) for c in columns for a in axes if a not in columns[c]]
    if missing:
        raise SystemExit(f"axes missing at level {args.level}: {missing}")
    print(markdown(columns, axes, args.level, args.keep))
    if args.plot:
        heatmap(columns, axes, args.level, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
