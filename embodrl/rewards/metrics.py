"""How a success classifier does on labelled frames: precision, recall, false-positive rate, false alarms."""

from __future__ import annotations

import numpy as np

CURVE_THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


def classification_metrics(
    probability: np.ndarray, label: np.ndarray, threshold: float, episode: np.ndarray | None = None
) -> dict[str, float]:
    """Frame-level counts and rates of `probability > threshold` against boolean `label` (both [F]); with
    `episode` [F], also `episode_false_alarm`: the share of episodes where the classifier fires on some
    frame before the first labelled success (or at all in an episode without one), which would end or
    reward that episode wrongly."""
    predicted, label = probability > threshold, label.astype(bool)
    tp = int((predicted & label).sum())
    fp = int((predicted & ~label).sum())
    fn = int((~predicted & label).sum())
    tn = int((~predicted & ~label).sum())
    out = {
        "threshold": float(threshold),
        "frames": int(label.size),
        "positives": tp + fn,
        "negatives": fp + tn,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        "fpr": _ratio(fp, fp + tn),
        "accuracy": _ratio(tp + tn, label.size),
    }
    if episode is not None:
        alarms = []
        for e in np.unique(episode):
            mine = episode == e
            hits = np.flatnonzero(label[mine])
            before = slice(None, hits[0]) if hits.size else slice(None)
            alarms.append(bool(predicted[mine][before].any()))
        out["episodes"] = len(alarms)
        out["episode_false_alarm"] = float(np.mean(alarms)) if alarms else 0.0
    return out


def _ranks(values: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(values, kind="stable"), kind="stable").astype(np.float64)


def progress_metrics(value: np.ndarray, label: np.ndarray, episode: np.ndarray) -> dict[str, float]:
    """How well per-frame outputs [F] serve as a dense reward on labelled episodes: `order`, the mean over
    episodes with a success of the Spearman correlation between the output and the frame index up to the
    first success (1: it rises all the way); `peak_success` / `peak_failure`, the mean of each episode's
    highest output in episodes with and without a success (apart: a failure never looks done)."""
    order, peak = [], {True: [], False: []}
    for e in np.unique(episode):
        mine = episode == e
        hits = np.flatnonzero(label[mine])
        peak[bool(hits.size)].append(float(value[mine].max()))
        if hits.size and hits[0] >= 2:
            v = value[mine][: hits[0] + 1]
            a, b = _ranks(v), _ranks(np.arange(len(v)))
            if a.std() > 0:
                order.append(float(np.corrcoef(a, b)[0, 1]))
    return {
        "order": float(np.mean(order)) if order else 0.0,
        "peak_success": float(np.mean(peak[True])) if peak[True] else 0.0,
        "peak_failure": float(np.mean(peak[False])) if peak[False] else 0.0,
    }


def threshold_curve(probability: np.ndarray, label: np.ndarray) -> list[dict[str, float]]:
    """precision / recall / fpr at a fixed set of thresholds (CURVE_THRESHOLDS)."""
    return [
        {
            k: v
            for k, v in classification_metrics(probability, label, t).items()
            if k in ("threshold", "precision", "recall", "fpr")
        }
        for t in CURVE_THRESHOLDS
    ]
