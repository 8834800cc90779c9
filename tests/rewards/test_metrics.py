"""Classifier metrics on a hand-made example."""

import numpy as np
import pytest

from embodrl.rewards.metrics import classification_metrics, progress_metrics, threshold_curve


def test_counts_rates_and_false_alarms_by_hand():
    # two episodes: [neg, neg, POS, POS] and a failure [neg, neg, neg]
    label = np.array([0, 0, 1, 1, 0, 0, 0], bool)
    probability = np.array([0.1, 0.7, 0.9, 0.4, 0.2, 0.6, 0.3])
    episode = np.array([0, 0, 0, 0, 1, 1, 1])
    m = classification_metrics(probability, label, 0.5, episode)
    # predicted: frames 1, 2, 5 -> tp 1 (frame 2), fp 2 (frames 1, 5), fn 1 (frame 3), tn 3
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (1, 2, 1, 3)
    assert m["precision"] == pytest.approx(1 / 3)
    assert m["recall"] == pytest.approx(1 / 2)
    assert m["fpr"] == pytest.approx(2 / 5)
    assert m["accuracy"] == pytest.approx(4 / 7)
    # episode 0 fires at frame 1, before its first success; episode 1 fires in a failure: both alarms
    assert m["episodes"] == 2 and m["episode_false_alarm"] == 1.0
    strict = classification_metrics(probability, label, 0.8, episode)
    assert (strict["tp"], strict["fp"], strict["episode_false_alarm"]) == (1, 0, 0.0)


def test_no_positives_predicted_gives_zero_precision_not_an_error():
    m = classification_metrics(np.zeros(3), np.array([1, 0, 0], bool), 0.5)
    assert m["precision"] == 0.0 and m["recall"] == 0.0 and m["fpr"] == 0.0


def test_the_curve_trades_recall_for_false_positives():
    label = np.array([0, 0, 1, 1], bool)
    curve = threshold_curve(np.array([0.15, 0.35, 0.55, 0.95]), label)
    assert [c["fpr"] for c in curve][:3] == [1.0, 0.5, 0.5] and curve[-1]["recall"] == 0.0
    assert all(a["recall"] >= b["recall"] for a, b in zip(curve, curve[1:], strict=False))


def test_progress_metrics_by_hand():
    # episode 0 rises to its success at frame 3; episode 1 (a failure) peaks at 0.4
    label = np.array([0, 0, 0, 1, 0, 0, 0], bool)
    value = np.array([0.1, 0.3, 0.2, 0.9, 0.2, 0.4, 0.1])
    episode = np.array([0, 0, 0, 0, 1, 1, 1])
    m = progress_metrics(value, label, episode)
    # ranks of [0.1, 0.3, 0.2, 0.9] = [0, 2, 1, 3] against [0, 1, 2, 3]: Spearman 1 - 6 * 2 / (4 * 15) = 0.8
    assert m["order"] == pytest.approx(0.8)
    assert m["peak_success"] == pytest.approx(0.9) and m["peak_failure"] == pytest.approx(0.4)
