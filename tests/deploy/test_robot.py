"""Robot protocol: duck-typed robots, RobotIO mapping, adapters' clear errors, the sim robot's faults."""

import importlib.util

import numpy as np
import pytest

from embodrl.deploy.config import ObservationKeys, RobotConfig
from embodrl.deploy.franka import FrankaRobot
from embodrl.deploy.robot import Robot, RobotIO, check_robot, connected, make_lerobot_robot
from embodrl.deploy.robot import camera_configs as make_cameras
from embodrl.deploy.sim_robot import SimRobot
from embodrl.errors import UserError
from tests.deploy.fakes import FakeRobot


def test_duck_typed_robot_satisfies_the_protocol_and_maps_to_requests():
    robot = FakeRobot()
    assert isinstance(robot, Robot)
    io = RobotIO(robot, ObservationKeys(), camera="cam", ee_position_features=("x.pos", "y.pos"))
    with connected(robot):
        assert robot.is_connected
        obs = robot.get_observation()
        request = io.request(obs, "stack the cubes")
        sent = io.action_vector(robot.send_action(io.action_dict(np.array([0.1, 0.2, 1.0]))))
    assert not robot.is_connected
    assert set(request) == {"observation/state", "observation/image", "prompt"}
    assert request["observation/state"].dtype == np.float32 and request["observation/image"].shape == (
        8,
        8,
        3,
    )
    np.testing.assert_allclose(sent, [0.1, 0.2, 1.0])
    np.testing.assert_allclose(io.ee_position(robot.get_observation()), [0.1, 0.2])


def test_not_a_robot_and_missing_camera_are_explained():
    with pytest.raises(UserError, match="lacks"):
        check_robot(object())
    with pytest.raises(UserError, match="no camera 'front'"):
        RobotIO(FakeRobot(), ObservationKeys(), camera="front")


@pytest.mark.skipif(importlib.util.find_spec("lerobot") is not None, reason="lerobot is installed")
def test_lerobot_pass_through_without_lerobot_says_how_to_install():
    with pytest.raises(UserError, match="pip install lerobot"):
        make_lerobot_robot("lerobot.robots.so_follower:SO101FollowerConfig", {})


@pytest.mark.skipif(importlib.util.find_spec("franky") is not None, reason="franky is installed")
def test_franka_without_driver_raises_a_clear_error():
    robot = FrankaRobot("172.16.0.2")
    assert "ee.x" in robot.observation_features and len(robot.action_features) == 4
    with pytest.raises(UserError, match="franky"):
        robot.connect()


def test_sim_robot_dropouts_hold_and_are_reported():
    with SimRobot(RobotConfig(kind="sim", task="reach", dropout_prob=0.5, seed=1)) as robot:
        assert set(robot.observation_features) >= {"ee.x", "ee.y", "ee.z"}
        start = robot.get_observation()["ee.z"]
        sent = [robot.send_action(dict.fromkeys(robot.action_names, 0.5)) for _ in range(20)]
        moved = robot.get_observation()["ee.z"] != start
    held = [s for s in sent if s["dx"] == 0.0]
    assert 0 < len(held) < 20  # some commands were lost, and send_action says so
    assert all(s["gripper"] == 0.5 for s in sent if s["dx"] != 0.0)
    assert moved


class _CameraRegistry:
    """LeRobot's CameraConfig choice registry in miniature: type name -> config class."""

    @staticmethod
    def get_choice_class(kind: str):
        if kind != "opencv":
            raise KeyError(kind)
        return dict  # stands for OpenCVCameraConfig: built from the remaining fields


def test_camera_configs_from_yaml_dicts_are_built_by_their_type():
    built = make_cameras(
        {"front": {"type": "opencv", "index_or_path": 0, "fps": 30}, "wrist": object}, _CameraRegistry
    )
    assert built["front"] == {"index_or_path": 0, "fps": 30} and built["wrist"] is object
    with pytest.raises(UserError, match="needs a type"):
        make_cameras({"front": {"index_or_path": 0}}, _CameraRegistry)
    with pytest.raises(UserError, match="unknown camera type 'zed'"):
        make_cameras({"front": {"type": "zed"}}, _CameraRegistry)
