"""Resetting the scene between the episodes of a learning robot (`reset.*`, ResetConfig).

robot: the robot's own reset (the sim stand-in's `reset_episode`); home: a scripted move of the arm to
`reset.home` with every action through the safety layer (its bounds, rate limits and workspace box);
operator: the operator resets the scene and presses Enter; auto: robot where the robot has a reset of its
own, else operator.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from embodrl.deploy.config import ResetConfig
from embodrl.deploy.robot import Robot, RobotIO
from embodrl.deploy.safety import SafetyLayer
from embodrl.errors import UserError

logger = logging.getLogger(__name__)
OPERATOR_PROMPT = "reset the scene, then press Enter to start the next episode"


def reset_mode(cfg: ResetConfig, robot: Robot) -> str:
    """The mode `cfg.mode` resolves to for `robot` (auto: its own reset where it has one, else operator)."""
    own = hasattr(robot, "reset_episode")
    if cfg.mode == "auto":
        return "robot" if own else "operator"
    if cfg.mode == "robot" and not own:
        raise UserError(
            "reset.mode=robot: this robot has no reset of its own; use reset.mode=home or operator"
        )
    return cfg.mode


def reset_scene(
    cfg: ResetConfig,
    robot: Robot,
    io: RobotIO,
    safety: SafetyLayer,
    fps: float,
    read_line: Callable[[str], Any] = input,
) -> None:
    """Reset before an episode as `cfg` says (`read_line` waits for the operator)."""
    mode = reset_mode(cfg, robot)
    if mode == "robot":
        robot.reset_episode()
    elif mode == "home":
        if not move_home(cfg, robot, io, safety, fps):
            logger.warning("reset: not home after reset.home_steps=%d steps; starting anyway", cfg.home_steps)
    else:
        read_line(f"{OPERATOR_PROMPT} ")


def move_home(cfg: ResetConfig, robot: Robot, io: RobotIO, safety: SafetyLayer, fps: float) -> bool:
    """Step toward `cfg.home` at `fps`, every action through `safety`, until every coordinate is within
    `cfg.home_tolerance` or `cfg.home_steps` passed; whether it arrived. With delta actions `home` is the
    end-effector position (moved along safety.ee_dims, the gripper open at safety.gripper_low); with
    absolute actions it is the target action [A], compared with the robot's reported position."""
    home, limits = np.asarray(cfg.home, dtype=np.float64), safety.cfg
    delta = limits.action_type == "delta"
    if len(home) != (3 if delta else io.action_dim):
        what = "the EE position [x, y, z]" if delta else f"a target action of {io.action_dim} values"
        raise UserError(
            f"reset.home has {len(home)} values; with safety.action_type={limits.action_type} give {what}"
        )
    observation = robot.get_observation()
    safety.reset(io.present_action(observation))
    for _ in range(cfg.home_steps):
        where = (
            ee_position(observation, limits.ee_position_features) if delta else io.present_action(observation)
        )
        error = home - where
        known = ~np.isnan(error)
        if known.any() and np.all(np.abs(error[known]) < cfg.home_tolerance):
            return True
        if delta:
            action = np.zeros(io.action_dim)
            action[list(limits.ee_dims)] = error / limits.ee_delta_scale
            if limits.gripper_dim is not None:
                action[limits.gripper_dim] = limits.gripper_low
        else:
            action = home
        robot.send_action(io.action_dict(safety.filter(action, where if delta else None)))
        time.sleep(1.0 / fps)
        observation = robot.get_observation()
    return False


def ee_position(observation: dict[str, Any], features: tuple[str, ...]) -> np.ndarray:
    """The end-effector position [3] from the robot's `features` (safety.ee_position_features)."""
    absent = [name for name in features if name not in observation]
    if absent:
        raise UserError(f"reset.mode=home needs the EE position: the robot does not report {absent}")
    return np.asarray([observation[name] for name in features], dtype=np.float64)
