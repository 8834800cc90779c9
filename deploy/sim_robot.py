"""The MuJoCo tabletop as a Robot: the stand-in for hardware in tests and dry runs of `embodrl deploy`.

One simulated arm (a VecEnv of one env), stepped once per `send_action`, with optional injected
link latency (every observation arrives `latency_s` late) and dropouts (a lost command leaves the
arm holding still; `send_action` then returns the hold action, which is what was really executed).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from embodrl.deploy.config import RobotConfig
from embodrl.deploy.robot import MotorsAndCameras
from embodrl.obs_keys import IMAGE_KEYS
from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env
from embodrl.sims.tabletop.layout import EE_START_HIGH, OBJECT_HIGH, OBJECT_LOW

EE_FEATURES = ("ee.x", "ee.y", "ee.z")  # the tabletop state starts with the EE position
NO_TIME_LIMIT = 10**6  # the deploy loop, not the sim, decides when an episode is over
# The end-effector box a learning policy stays in (`embodrl actor --robot` turns it on by default): the
# region where objects are placed, 10 cm wider on each side, from 1 cm above the table (grasps reach down
# to the cube's centre, 2.25 cm) to 10 cm above the highest start of the arm.
BOX_MARGIN, TABLE_CLEARANCE = 0.1, 0.01
LEARNING_WORKSPACE = tuple(
    tuple(round(float(value), 3) for value in corner)
    for corner in (
        (*(OBJECT_LOW - BOX_MARGIN), TABLE_CLEARANCE),
        (*(OBJECT_HIGH + BOX_MARGIN), EE_START_HIGH[2] + BOX_MARGIN),
    )
)


class SimRobot(MotorsAndCameras):
    """A tabletop sim arm behind the Robot protocol; `done`/`success` tell the loop when the task ended."""

    def __init__(self, cfg: RobotConfig, image_size: int = 64) -> None:
        self.cfg = cfg
        env_cfg = EnvConfig(
            suite=cfg.suite,
            task=cfg.task,
            num_envs=1,
            seed=cfg.seed,
            max_episode_steps=NO_TIME_LIMIT,
            obs_mode="rgb" if cfg.camera or cfg.wrist_camera else "state",
            image_size=image_size,
            wrist_camera=bool(cfg.wrist_camera),
            num_threads=1,
        )
        self.env = make_env(env_cfg)
        spec = self.env.observation_spec
        state_dim = spec["state"].shape[0]
        self.state_names = EE_FEATURES + tuple(f"state.{i}" for i in range(len(EE_FEATURES), state_dim))
        self.cameras = [key for key in IMAGE_KEYS if key in spec]
        self.action_names = self.env.action_spec.names
        self._rng = np.random.default_rng(cfg.seed)
        self.done = self.success = False

    @property
    def camera_shapes(self) -> dict[str, tuple[int, ...]]:
        return {key: tuple(self.env.observation_spec[key].shape) for key in self.cameras}

    @property
    def instruction(self) -> str:
        """The current task in words (the prompt when the deploy config gives none)."""
        return self.env.instructions(self._obs["task_id"])[0]

    def connect(self) -> None:
        self.reset_episode(self.cfg.seed)
        self.is_connected = True

    def reset_episode(self, seed: int | None = None) -> None:
        """Start a new episode (a human resets a real scene instead)."""
        self._obs = self.env.reset(seed=seed)
        self._gripper = -1.0
        self.done = self.success = False

    def get_observation(self) -> dict[str, Any]:
        if self.cfg.latency_s:
            time.sleep(self.cfg.latency_s)
        state = self._obs["state"][0].numpy()
        obs: dict[str, Any] = dict(zip(self.state_names, map(float, state), strict=True))
        for key in self.cameras:
            obs[key] = self._obs[key][0].numpy()
        return obs

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        vector = np.asarray([action[name] for name in self.action_names], dtype=np.float32)
        if self._rng.random() < self.cfg.dropout_prob:
            vector = np.zeros_like(vector)
            vector[-1] = self._gripper  # the command was lost: the arm holds still
        self._gripper = float(vector[-1])
        result = self.env.step(torch.from_numpy(vector).view(1, 1, -1))
        self.success = self.success or bool(result.success[0])
        self.done = bool(result.done[0])
        self._obs = result.final_obs  # after an auto-reset, keep showing the episode that just ended
        return dict(zip(self.action_names, map(float, vector), strict=True))

    def disconnect(self) -> None:
        self.env.close()
        self.is_connected = False
