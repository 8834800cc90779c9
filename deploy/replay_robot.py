"""A recorded LeRobot dataset as a Robot: a dry run of `embodrl deploy` against real recordings before the
real robot is switched on.

Each episode replays one recorded episode. Features are named as the robot that recorded them names them:
motors after the state feature's names (LeRobot's `shoulder_pan.pos`, ...), cameras after their feature
(`observation.images.front` -> `front`). The scene does not react: observations follow the recording
whatever the policy commands (open loop), and `send_action` keeps the policy's error against the action
that was recorded at that step.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.data.lerobot_format import ACTION_KEY, LEROBOT_KEYS
from embodrl.deploy.config import RobotConfig, robot_camera
from embodrl.deploy.robot import MotorsAndCameras
from embodrl.errors import UserError

STATE_FEATURE = LEROBOT_KEYS["state"]
logger = logging.getLogger(__name__)


def feature_names(feature: dict, prefix: str) -> list[str]:
    """A vector feature's element names (LeRobot: a list, or {"motors": [...]}), else prefix.0, prefix.1..."""
    names = feature.get("names")
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    size = int(feature["shape"][0])
    if isinstance(names, list) and len(names) == size and all(isinstance(n, str) for n in names):
        return names
    return [f"{prefix}.{i}" for i in range(size)]


class ReplayRobot(MotorsAndCameras):
    """Plays `robot.dataset`'s episodes from `robot.episode` on, one per deploy episode."""

    def __init__(self, cfg: RobotConfig) -> None:
        self.dataset = LeRobotDataset(cfg.dataset)
        features = self.dataset.features
        if STATE_FEATURE not in features or ACTION_KEY not in features:
            raise UserError(
                f"robot.dataset={cfg.dataset} needs {STATE_FEATURE!r} and {ACTION_KEY!r} features"
            )
        if not 0 <= cfg.episode < self.dataset.num_episodes:
            raise UserError(
                f"robot.episode={cfg.episode}: the dataset has {self.dataset.num_episodes} episodes"
            )
        self.state_names = feature_names(features[STATE_FEATURE], "state")
        self.action_names = feature_names(features[ACTION_KEY], "action")
        self.cameras = {robot_camera(key): key for key in self.dataset.camera_keys}
        self.episode_index = cfg.episode - 1  # connect() moves to cfg.episode
        self.action_errors: list[float] = []  # per step: mean |sent - recorded| over the action elements
        self.done = self.success = False

    @property
    def camera_shapes(self) -> dict[str, tuple[int, ...]]:
        return {camera: tuple(self.dataset.features[key]["shape"]) for camera, key in self.cameras.items()}

    @property
    def instruction(self) -> str:
        return self._episode["task"]

    def connect(self) -> None:
        self.reset_episode()
        self.is_connected = True

    def reset_episode(self) -> None:
        """The next recorded episode (wrapping around)."""
        self.episode_index = (self.episode_index + 1) % self.dataset.num_episodes
        self._episode = self.dataset.episode(self.episode_index)
        self._step = 0
        self.done = False

    def get_observation(self) -> dict[str, Any]:
        state = np.asarray(self._episode[STATE_FEATURE][self._step], dtype=np.float64).reshape(-1)
        obs: dict[str, Any] = dict(zip(self.state_names, map(float, state), strict=True))
        for camera, key in self.cameras.items():
            obs[camera] = self._episode[key][self._step]
        return obs

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        sent = np.asarray([action[name] for name in self.action_names], dtype=np.float64)
        recorded = np.asarray(self._episode[ACTION_KEY][self._step], dtype=np.float64).reshape(-1)
        self.action_errors.append(float(np.abs(sent - recorded).mean()))
        self._step += 1
        self.done = self._step >= len(self._episode[ACTION_KEY])
        if self.done:
            self._step -= 1  # hold the last frame until the loop starts the next episode
        return dict(zip(self.action_names, map(float, sent), strict=True))

    def disconnect(self) -> None:
        if self.action_errors:  # what a dry run measures: how far the policy is from the recorded actions
            logger.info(
                "mean |action - recorded action| over %d steps: %.4f",
                len(self.action_errors),
                sum(self.action_errors) / len(self.action_errors),
            )
        self.is_connected = False
