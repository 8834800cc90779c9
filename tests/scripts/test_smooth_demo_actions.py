"""scripts/smooth_demo_actions.py: a demo dataset copy with moving-averaged actions, per episode."""

import runpy
from pathlib import Path

import numpy as np
import pytest

from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.data.lerobot_writer import LeRobotDatasetWriter
from embodrl.errors import UserError

SCRIPT = Path(__file__).parents[2] / "scripts" / "smooth_demo_actions.py"
script = runpy.run_path(str(SCRIPT))

FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [2], "names": None},
    "action": {"dtype": "float32", "shape": [2], "names": ["dx", "gripper"]},
}


def write_demos(root: Path) -> None:
    with LeRobotDatasetWriter(root, 10, FEATURES) as writer:
        for first in (0, 1):  # two episodes of the same bang-bang step, the gripper switching mid-way
            dx = np.array([1, 1, 1, -1, -1], dtype=np.float32)
            gripper = np.array([-1, -1, 1, 1, 1], dtype=np.float32)
            state = np.arange(10, dtype=np.float32).reshape(5, 2)
            writer.add_episode(
                {"observation.state": state, "action": np.stack([dx, gripper], axis=1)},
                "pick",
                {"init_state_id": first},
            )


def test_the_window_shrinks_at_the_ends():
    values = np.array([[0.0], [3.0], [6.0], [0.0]])
    smoothed = script["centered_moving_average"](values, 3)
    np.testing.assert_allclose(smoothed[:, 0], [1.5, 3.0, 3.0, 3.0])


def test_smooths_the_arm_dims_inside_each_episode_and_keeps_the_rest(tmp_path):
    write_demos(tmp_path / "src")
    assert script["smooth_dataset"](str(tmp_path / "src"), str(tmp_path / "out"), 3, ["gripper"]) == 2
    src, out = LeRobotDataset(tmp_path / "src"), LeRobotDataset(tmp_path / "out")
    for episode in (0, 1):
        before, after = src.episode(episode), out.episode(episode)
        # inside its own episode only: an average across the seam would give -1/3 and 1/3 at the ends
        np.testing.assert_allclose(after["action"][:, 0], [1, 1, 1 / 3, -1 / 3, -1], atol=1e-6)
        np.testing.assert_array_equal(after["action"][:, 1], before["action"][:, 1])  # the gripper as it was
        np.testing.assert_array_equal(after["observation.state"], before["observation.state"])
    assert out.episodes["init_state_id"] == src.episodes["init_state_id"]
    assert out.stats["action"]["max"][0] == pytest.approx(1.0)
    assert out.stats["action"]["std"][0] < src.stats["action"]["std"][0]  # stats of the smoothed actions


def test_refuses_an_even_window_and_an_unknown_dim(tmp_path):
    write_demos(tmp_path / "src")
    with pytest.raises(UserError, match="odd"):
        script["smooth_dataset"](str(tmp_path / "src"), str(tmp_path / "a"), 4, ["gripper"])
    with pytest.raises(UserError, match="wrist"):
        script["smooth_dataset"](str(tmp_path / "src"), str(tmp_path / "b"), 3, ["wrist"])
