"""The robustness plot: success per axis and level with 95% intervals, against the nominal band."""

from __future__ import annotations

from pathlib import Path


def plot_robustness(report: dict, path: Path) -> Path | None:
    """robustness.png of a `run_robustness` report; None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    nominal, rows = report["rows"][0], report["rows"][1:]
    axes = list(dict.fromkeys(row["axis"] for row in rows))
    width = 0.8 / max((sum(r["axis"] == a for r in rows) for a in axes), default=1)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(axes) + 2), 4))
    lo, hi = nominal["success_ci95"]
    ax.axhspan(100 * lo, 100 * hi, color="0.85", label="nominal 95% CI")
    ax.axhline(100 * nominal["success_rate"], color="0.3", lw=1, label="nominal")
    colours = plt.get_cmap("viridis")
    for i, axis in enumerate(axes):
        for j, row in enumerate(r for r in rows if r["axis"] == axis):
            rate, (low, high) = 100 * row["success_rate"], row["success_ci95"]
            ax.bar(
                i - 0.4 + (j + 0.5) * width,
                rate,
                width * 0.9,
                yerr=[[rate - 100 * low], [100 * high - rate]],
                color=colours(row["level"] / 3.5),
                capsize=2,
                label=f"level {row['level']}",
            )
    ax.set_xticks(range(len(axes)), axes, rotation=30, ha="right")
    ax.set_ylabel("success (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"robustness over {report['episodes']} paired episodes per level")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))  # one entry per level
    order = sorted(unique, key=lambda label: (label.startswith("level"), label))  # nominal first
    ax.legend([unique[label] for label in order], order, fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
