"""Which demos `embodrl eval --demos` can replay: per-episode info in meta/episodes, and its errors.

The replay itself runs end to end in tests/test_cli.py (collect -> sft -> eval --demos)."""

from __future__ import annotations

import numpy as np
import pytest

from embodrl.data.lerobot_dataset import LeRobotDataset, LeRobotDatasetWriter
from embodrl.errors import UserError
from embodrl.train.demo_replay import replayable_episodes

FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [2], "names": None},
    "action": {"dtype": "float32", "shape": [1], "names": None},
}


def _episode(length: int) -> dict[str, np.ndarray]:
    state, action = np.zeros((length, 2), np.float32), np.ones((length, 1), np.float32)
    return {"observation.state": state, "action": action}


def _write(root, infos: list[dict | None]) -> LeRobotDataset:
    with LeRobotDatasetWriter(root, 10, FEATURES) as writer:
        for n, info in enumerate(infos):
            writer.add_episode(_episode(2 + n), "reach", info)
    return LeRobotDataset(root)


def test_episode_info_survives_finalize_and_selects_the_envs_task(tmp_path):
    ds = _write(
        tmp_path / "ds",
        [
            {"init_state_id": 7, "env_task": "pick"},
            {"init_state_id": 3, "env_task": "push"},
            {"init_state_id": 9, "env_task": "pick"},
        ],
    )
    assert ds.episodes["init_state_id"] == [7, 3, 9]
    assert replayable_episodes(ds, "pick") == [0, 2] and replayable_episodes(ds, "push") == [1]
    with pytest.raises(UserError, match="env.task=... to match"):
        replayable_episodes(ds, None)


def test_datasets_without_initial_states_and_bad_info_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="initial state ids"):
        replayable_episodes(_write(tmp_path / "plain", [None, None]), None)
    with LeRobotDatasetWriter(tmp_path / "bad", 10, FEATURES) as writer:
        for info in ({"length": 3}, {"videos/x": 1}, {"init_state_id": [1, 2]}):
            with pytest.raises(UserError, match="episode info keys"):
                writer.add_episode(_episode(2), "reach", info)
        writer.add_episode(_episode(2), "reach", {"init_state_id": 0})  # the writer is still usable
