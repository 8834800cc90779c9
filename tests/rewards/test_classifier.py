"""The success classifier: learns a separable toy set, scores held-out episodes, saves and loads safely."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from embodrl.data.lerobot_dataset import LeRobotDatasetWriter
from embodrl.errors import UserError
from embodrl.rewards.classifier import WEIGHTS_FILE, load_classifier
from embodrl.rewards.config import RewardTrainConfig
from embodrl.rewards.training import (
    METRICS_FILE,
    progress_targets,
    score_reward_model,
    split_episodes,
    train_reward_model,
)

SIZE = 32

DECOY = 170  # a paler square than a success's 250, over noise of 0-99


def _toy_dataset(root, episodes: int = 8, length: int = 10, decoy: bool = False) -> None:
    """Episodes whose frames show a bright square in the top-left corner once the 'task' is done (from frame
    6 on in even episodes; never in odd ones), on random noise; the state is noise. With `decoy`, no episode
    succeeds and from frame 6 on a paler square sits in the same corner: false alarms for a classifier that
    learned brightness there."""
    rng = np.random.default_rng(1 if decoy else 0)
    features = {
        "observation.images.main": {"dtype": "video", "shape": [SIZE, SIZE, 3]},
        "observation.state": {"dtype": "float32", "shape": [3]},
        "action": {"dtype": "float32", "shape": [2]},
        "next.reward": {"dtype": "float32", "shape": [1]},
        "next.done": {"dtype": "bool", "shape": [1]},
    }
    with LeRobotDatasetWriter(root, 10, features) as writer:
        for e in range(episodes):
            done = np.arange(length) >= 6 if e % 2 == 0 and not decoy else np.zeros(length, bool)
            images = rng.integers(0, 100, (length, SIZE, SIZE, 3)).astype(np.uint8)
            images[done, :12, :12] = 250
            if decoy:
                images[6:, :12, :12] = DECOY
            writer.add_episode(
                {
                    "observation.images.main": images,
                    "observation.state": rng.normal(size=(length, 3)).astype(np.float32),
                    "action": np.zeros((length, 2), np.float32),
                    "next.reward": done.astype(np.float32),
                    "next.done": np.arange(length) == length - 1,
                },
                "toy",
            )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward")
    _toy_dataset(root / "data")
    cfg = RewardTrainConfig(out=str(root / "model"), blocks=3, epochs=30, held_out=0.25, hidden=32)
    out, metrics = train_reward_model(root / "data", cfg)
    return out, metrics


def test_learns_a_separable_set_and_scores_held_out_episodes(trained):
    out, metrics = trained
    held = metrics["held_out"]
    assert metrics["episodes"] == {"train": 6, "held_out": 2}  # one with a success, one without
    assert held["positives"] == 4 and held["negatives"] == 16
    assert held["recall"] == 1.0 and held["fpr"] == 0.0 and held["precision"] == 1.0
    assert json.loads((out / METRICS_FILE).read_text())["held_out"] == held


def test_checkpoint_round_trip_gives_the_same_probabilities(trained):
    out, _ = trained
    model = load_classifier(out)
    rng = np.random.default_rng(1)
    images = rng.integers(0, 100, (4, SIZE, SIZE, 3)).astype(np.uint8)
    images[:2, :12, :12] = 250
    obs = TensorDict({"rgb": torch.from_numpy(images), "state": torch.randn(4, 3)}, batch_size=[4])
    p = model.probability(obs)
    assert (p[:2] > 0.5).all() and (p[2:] < 0.5).all()
    assert torch.equal(p, load_classifier(out).probability(obs))


def test_missing_and_broken_checkpoints_are_one_line_errors(trained, tmp_path):
    out, _ = trained
    with pytest.raises(UserError, match="is not a reward model"):
        load_classifier(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((out / "config.json").read_text())
    (broken / WEIGHTS_FILE).write_bytes(b"not safetensors")
    with pytest.raises(UserError, match="broken reward model"):
        load_classifier(broken)
    (broken / "config.json").write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        load_classifier(broken)


def test_a_dataset_without_labels_is_refused(tmp_path):
    features = {"observation.images.main": {"dtype": "video", "shape": [SIZE, SIZE, 3]}}
    with LeRobotDatasetWriter(tmp_path / "d", 10, features) as writer:
        writer.add_episode({"observation.images.main": np.zeros((2, SIZE, SIZE, 3), np.uint8)}, "x")
    with pytest.raises(UserError, match="no per-frame success labels"):
        train_reward_model(tmp_path / "d", RewardTrainConfig(obs_keys=("rgb",)))


def test_split_is_by_episode_and_holds_out_both_kinds():
    has = np.array([True] * 8 + [False] * 4)
    train, test = split_episodes(has, 0.25, seed=3)
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(12))
    assert has[test].sum() == 2 and (~has[test]).sum() == 1


def test_progress_targets_rise_to_the_first_success_and_skip_failures():
    label = np.array([0, 0, 0, 0, 1, 1, 0, 0], bool)
    episode = np.array([0, 0, 0, 0, 0, 0, 1, 1])
    progress, known = progress_targets(label, episode)
    np.testing.assert_allclose(progress[:6], [0, 0.25, 0.5, 0.75, 1, 1])
    assert known.tolist() == [True] * 6 + [False] * 2


def test_a_progress_model_is_scored_and_refused_as_a_success_reward(tmp_path):
    _toy_dataset(tmp_path / "data")
    cfg = RewardTrainConfig(model="progress", out=str(tmp_path / "p"), blocks=3, epochs=30, hidden=32)
    out, metrics = train_reward_model(tmp_path / "data", cfg)
    assert metrics["held_out"]["threshold"] == 0.95
    progress = metrics["held_out_progress"]
    assert progress["peak_success"] > progress["peak_failure"]
    with pytest.raises(UserError, match="not a success classifier"):
        load_classifier(out)


def test_a_policy_s_false_alarms_join_the_training_set(tmp_path):
    _toy_dataset(tmp_path / "demos")
    _toy_dataset(tmp_path / "rollouts", episodes=4, decoy=True)
    cfg = RewardTrainConfig(out=str(tmp_path / "first"), blocks=3, epochs=30, hidden=32)
    first, _ = train_reward_model(tmp_path / "demos", cfg)
    cfg = RewardTrainConfig(out=str(tmp_path / "both"), blocks=3, epochs=30, hidden=32)
    both, metrics = train_reward_model([tmp_path / "demos", tmp_path / "rollouts"], cfg)
    assert metrics["episodes"] == {"train": 9, "held_out": 3}
    assert {name for name, _ in metrics["held_out_episodes"]} <= {
        str(tmp_path / "demos"),
        str(tmp_path / "rollouts"),
    }
    by_dataset = metrics["held_out_by_dataset"]
    assert sum(part["episodes"] for part in by_dataset.values()) == 3
    rng = np.random.default_rng(2)
    images = rng.integers(0, 100, (4, SIZE, SIZE, 3)).astype(np.uint8)
    images[:2, :12, :12] = 250  # success
    images[2:, :12, :12] = DECOY
    obs = TensorDict({"rgb": torch.from_numpy(images), "state": torch.randn(4, 3)}, batch_size=[4])
    before, after = load_classifier(first).probability(obs), load_classifier(both).probability(obs)
    assert (before > 0.5).all()  # trained on demos alone, it fires on the decoy
    assert (after[:2] > 0.5).all() and (after[2:] < 0.5).all()


def test_datasets_of_other_shapes_are_refused(tmp_path):
    _toy_dataset(tmp_path / "demos")
    features = {
        "observation.images.main": {"dtype": "video", "shape": [SIZE // 2, SIZE // 2, 3]},
        "observation.state": {"dtype": "float32", "shape": [3]},
        "action": {"dtype": "float32", "shape": [2]},
        "next.reward": {"dtype": "float32", "shape": [1]},
    }
    with LeRobotDatasetWriter(tmp_path / "small", 10, features) as writer:
        writer.add_episode(
            {
                "observation.images.main": np.zeros((2, SIZE // 2, SIZE // 2, 3), np.uint8),
                "observation.state": np.zeros((2, 3), np.float32),
                "action": np.zeros((2, 2), np.float32),
                "next.reward": np.zeros((2, 1), np.float32),
            },
            "x",
        )
    with pytest.raises(UserError, match="a classifier trains on one kind"):
        train_reward_model([tmp_path / "demos", tmp_path / "small"], RewardTrainConfig(blocks=3))


def test_eval_scores_a_trained_classifier_on_each_dataset(tmp_path):
    _toy_dataset(tmp_path / "demos")
    _toy_dataset(tmp_path / "rollouts", episodes=4, decoy=True)
    cfg = RewardTrainConfig(out=str(tmp_path / "first"), blocks=3, epochs=30, hidden=32)
    first, _ = train_reward_model(tmp_path / "demos", cfg)
    scores = score_reward_model(first, [tmp_path / "demos", tmp_path / "rollouts"])
    demos, rollouts = scores[str(tmp_path / "demos")], scores[str(tmp_path / "rollouts")]
    assert (demos["episodes"], demos["frames"], demos["positives"]) == (8, 80, 16)
    assert demos["recall"] == 1.0
    # the decoy frames (6-9 of each episode, 16 in all) fire, the others (24) do not
    assert (rollouts["episodes"], rollouts["positives"]) == (4, 0) and 12 <= rollouts["fp"] <= 16
    assert rollouts["episode_false_alarm"] == 1.0
