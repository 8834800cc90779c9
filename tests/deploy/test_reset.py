"""Resets between learning episodes: the robot's own, a scripted move home through the safety layer, the
operator's Enter."""

from __future__ import annotations

import numpy as np
import pytest

from embodrl.deploy.config import ObservationKeys, ResetConfig, RobotConfig, SafetyConfig
from embodrl.deploy.reset import reset_mode, reset_scene
from embodrl.deploy.robot import RobotIO, connected
from embodrl.deploy.safety import SafetyLayer
from embodrl.deploy.sim_robot import SimRobot
from embodrl.errors import UserError

FPS = 200.0


@pytest.fixture
def sim():
    robot = SimRobot(RobotConfig(kind="sim", task="reach"))
    with connected(robot):
        yield robot, RobotIO(robot, ObservationKeys())


def test_home_moves_the_arm_there_through_the_safety_layer(sim):
    robot, io = sim
    home = (0.4, 0.1, 0.15)
    safety = SafetyLayer(SafetyConfig(), io.action_dim, FPS)
    reset_scene(ResetConfig(mode="home", home=home), robot, io, safety, FPS)
    ee = np.array([robot.get_observation()[name] for name in ("ee.x", "ee.y", "ee.z")])
    assert np.abs(ee - home).max() < 0.005
    assert safety.counters.rate_clamps > 0  # the first big steps were limited: it went through the layer


def test_a_home_of_the_wrong_size_is_a_one_line_error(sim):
    robot, io = sim
    safety = SafetyLayer(SafetyConfig(), io.action_dim, FPS)
    with pytest.raises(UserError, match=r"reset.home has 2 values.*EE position"):
        reset_scene(ResetConfig(mode="home", home=(0.4, 0.1)), robot, io, safety, FPS)


def test_auto_is_the_robots_own_reset_else_the_operators_enter(sim):
    robot, io = sim
    assert reset_mode(ResetConfig(), robot) == "robot"
    without_reset = object()
    assert reset_mode(ResetConfig(), without_reset) == "operator"
    with pytest.raises(UserError, match="no reset of its own"):
        reset_mode(ResetConfig(mode="robot"), without_reset)
    prompts = []
    safety = SafetyLayer(SafetyConfig(), io.action_dim, FPS)
    reset_scene(ResetConfig(mode="operator"), robot, io, safety, FPS, read_line=prompts.append)
    assert len(prompts) == 1 and "press Enter" in prompts[0]
