"""A policy's inputs resolved against a dataset alone: cameras by name, key_map first, clear refusals."""

from __future__ import annotations

import pytest

from embodrl.data.dataset_inputs import dataset_inputs
from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.errors import UserError
from tests.data.robot_dataset import SIZE, TASKS, write_robot_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> LeRobotDataset:
    return LeRobotDataset(
        write_robot_dataset(tmp_path_factory.mktemp("robot") / "so100", episodes=2, length=3)
    )


def test_cameras_are_matched_by_name_and_sizes_come_from_the_dataset(dataset):
    inputs = dataset_inputs(dataset, ["wrist_rgb", "rgb", "state"])
    assert inputs.features == {
        "wrist_rgb": "observation.images.wrist",
        "rgb": "observation.images.front",
        "state": "observation.state",
    }
    assert inputs.shapes == {"wrist_rgb": (SIZE, SIZE, 3), "rgb": (SIZE, SIZE, 3), "state": (6,)}
    assert inputs.action_dim == 6
    assert set(inputs.tasks) == set(TASKS)


def test_key_map_names_a_camera_that_name_matching_would_not_pick(dataset):
    inputs = dataset_inputs(dataset, ["rgb"], {"rgb": "observation.images.wrist"})
    assert inputs.features == {"rgb": "observation.images.wrist"}


@pytest.mark.parametrize(
    ("obs_keys", "key_map", "message"),
    [
        (["state", "privileged"], {}, "privileged"),
        (["rgb"], {"rgb": "observation.images.top"}, "lacks"),
        (["rgb"], {"rgb": "observation.state"}, "not a camera"),
        (["state"], {"state": "observation.images.front"}, "is a camera"),
    ],
)
def test_inputs_the_dataset_cannot_give_are_refused_in_one_line(dataset, obs_keys, key_map, message):
    with pytest.raises(UserError, match=message) as error:
        dataset_inputs(dataset, obs_keys, key_map)
    assert "\n" not in str(error.value)
