"""Franka (FR3 / Panda) through the franky driver: end-effector delta actions, like the tabletop sim.

Actions: [dx, dy, dz] in units of `POS_SCALE` m (the tabletop controller's scale) plus a gripper
command in [-1, 1] (-1 open, 1 closed); orientation is held. Observations: the 7 joint positions,
the end-effector position (`ee.x/y/z`, the safety box reads them) and the gripper width. No
cameras: attach them yourself (e.g. wrap this class) if the policy reads images.
Written against franky's documented API but NOT tested on hardware in this repository: start with
a low `robot.franka_dynamics`, a tight safety box, and a hand on the stop button.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embodrl.deploy.robot import RobotBase
from embodrl.errors import UserError

POS_SCALE = 0.02  # m per unit action (sims/tabletop/controller.py)
GRIPPER_MAX_WIDTH = 0.08  # m, Franka Hand
GRIPPER_SPEED = 0.05  # m/s
JOINTS = tuple(f"joint{i}.pos" for i in range(1, 8))


class FrankaRobot(RobotBase):
    """A Franka arm + hand driven by franky (`pip install franky-control`; libfranka needs an RT kernel)."""

    def __init__(self, host: str, dynamics: float = 0.05) -> None:
        self.host, self.dynamics = host, dynamics
        self._robot = self._gripper = None

    @property
    def observation_features(self) -> dict[str, Any]:
        return {
            **{name: float for name in JOINTS},
            "ee.x": float,
            "ee.y": float,
            "ee.z": float,
            "gripper.width": float,
        }

    @property
    def action_features(self) -> dict[str, Any]:
        return {"dx": float, "dy": float, "dz": float, "gripper": float}

    def connect(self) -> None:
        try:
            import franky
        except ImportError as error:
            raise UserError(
                "robot.kind=franka needs the franky driver: pip install franky-control (and a real-time "
                "kernel for libfranka, see franky's README); it is not installed here"
            ) from error
        self._franky = franky
        self._robot = franky.Robot(self.host)
        self._robot.relative_dynamics_factor = self.dynamics
        self._gripper = franky.Gripper(self.host)
        self.is_connected = True

    def get_observation(self) -> dict[str, Any]:
        joints = np.asarray(self._robot.current_joint_state.position)
        ee = np.asarray(self._robot.current_cartesian_state.pose.end_effector_pose.translation)
        obs = dict(zip(JOINTS, map(float, joints), strict=True))
        obs.update({"ee.x": float(ee[0]), "ee.y": float(ee[1]), "ee.z": float(ee[2])})
        obs["gripper.width"] = float(self._gripper.width)
        return obs

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        franky = self._franky
        delta = [POS_SCALE * float(action[k]) for k in ("dx", "dy", "dz")]
        motion = franky.CartesianMotion(franky.Affine(delta), franky.ReferenceType.Relative)
        self._robot.move(motion, asynchronous=True)  # replaces the running motion: no queue build-up
        width = GRIPPER_MAX_WIDTH * (1.0 - float(np.clip(action["gripper"], -1, 1))) / 2
        self._gripper.move_async(width, GRIPPER_SPEED)
        return dict(action)

    def disconnect(self) -> None:
        # each motion is a bounded relative step (<= POS_SCALE per axis), so nothing keeps moving
        self._robot = self._gripper = None
        self.is_connected = False
