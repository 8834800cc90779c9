"""Scripted experts: per task a list of waypoint stages, run as a state machine per env.

Each stage names a target for the controller's target point, a gripper command, and when it is
done (hand within `tol` of the target, or after `wait` steps); the last stage holds. Actions
steer the controller's target (not the lagging hand) so the arm never overshoots a waypoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from embodrl.sims.tabletop.controller import POS_SCALE, R_DOWN, ROT_SCALE, rotation_error
from embodrl.sims.tabletop.rewards import TaskFrame
from embodrl.sims.tabletop.scene import CUBE_HALF
from embodrl.sims.tabletop.tasks import TASK_NAMES

OPEN, CLOSED = -1.0, 1.0
GRASP_DZ = 0.005  # grasp 5 mm above the cube centre so the pads clear the table
CARRY_Z = 0.17
PUSH_BACKOFF = 0.07  # m behind the cube where a push starts
PUSH_CONTACT = 0.038  # m from cube centre to the hand when touching it
PUSH_MAX_LATERAL = 0.02  # m off the push line before the expert lifts and realigns

Target = Callable[[TaskFrame], np.ndarray]


@dataclass(frozen=True)
class Stage:
    target: Target
    gripper: float
    tol: float = 0.0  # done when the hand is this close (0: never)
    wait: int = 0  # done after this many steps (0: never)


def _offset(base: Callable[[TaskFrame], np.ndarray], dx=0.0, dy=0.0, dz=0.0) -> Target:
    return lambda f: base(f) + np.array([dx, dy, dz])


def _at_height(base: Callable[[TaskFrame], np.ndarray], z: float) -> Target:
    return lambda f: np.concatenate([base(f)[:, :2], np.full((len(f.task), 1), z)], -1)


def _main(f: TaskFrame) -> np.ndarray:
    return f.main


def _goal(f: TaskFrame) -> np.ndarray:
    return f.goal


def _push_dir(f: TaskFrame) -> np.ndarray:
    d = f.goal[:, :2] - f.main[:, :2]
    d = d / np.maximum(np.linalg.norm(d, axis=-1, keepdims=True), 1e-6)
    return np.concatenate([d, np.zeros((len(d), 1))], -1)


def _behind(height: float, dist: float) -> Target:
    return lambda f: _at_height(_main, height)(f) - dist * _push_dir(f)


def _grasp(lift: Stage) -> list[Stage]:
    return [
        Stage(_offset(_main, dz=0.08), OPEN, tol=0.015),
        Stage(_offset(_main, dz=GRASP_DZ), OPEN, tol=0.007),
        Stage(_offset(_main, dz=GRASP_DZ), CLOSED, wait=5),
        lift,
    ]


def _carry_to(goal_dz: float) -> list[Stage]:
    return [
        Stage(_at_height(_goal, CARRY_Z), CLOSED, tol=0.015),
        Stage(_offset(_goal, dz=goal_dz), CLOSED, tol=0.008),
        Stage(_offset(_goal, dz=goal_dz), OPEN, wait=4),
        Stage(_offset(_goal, dz=0.12), OPEN),
    ]


STAGES: dict[str, list[Stage]] = {
    "reach": [Stage(_main, OPEN)],
    "push": [
        Stage(_behind(0.08, PUSH_BACKOFF), CLOSED, tol=0.015),
        Stage(_behind(CUBE_HALF, PUSH_BACKOFF), CLOSED, tol=0.006),
        Stage(_behind(CUBE_HALF, PUSH_CONTACT - 0.04), CLOSED),  # aim 4 cm into the cube: it slides
    ],
    "pick": _grasp(Stage(_at_height(_main, 0.2), CLOSED)),
    "place": _grasp(Stage(_at_height(_main, CARRY_Z), CLOSED, tol=0.03)) + _carry_to(0.045),
    "stack": _grasp(Stage(_at_height(_main, CARRY_Z), CLOSED, tol=0.03))
    + _carry_to(2 * CUBE_HALF + GRASP_DZ + 0.006),
    "press": [Stage(_offset(_main, dz=0.06), CLOSED, tol=0.01), Stage(_offset(_main, dz=-0.006), CLOSED)],
}
_PUSH = TASK_NAMES.index("push")


class ScriptedExpert:
    """Phase and step counter per env; `act` advances them and returns ee-delta actions [N, 7]."""

    def __init__(self, num_envs: int):
        self.phase = np.zeros(num_envs, dtype=np.int64)
        self.count = np.zeros(num_envs, dtype=np.int64)

    def reset(self, ids: np.ndarray) -> None:
        self.phase[ids] = 0
        self.count[ids] = 0

    def act(self, frame: TaskFrame, ctrl_target: np.ndarray, ctrl_rot: np.ndarray) -> np.ndarray:
        """Actions [N, 7] from the task frame and the controller's target pose [N, 3], [N, 3, 3]."""
        n = len(frame.task)
        target = np.zeros((n, 3))
        gripper = np.zeros(n)
        self._realign_pushes(frame)
        for t, name in enumerate(TASK_NAMES):
            stages = STAGES[name]
            for k, stage in enumerate(stages):
                ids = np.flatnonzero((frame.task == t) & (self.phase == k))
                if ids.size == 0:
                    continue
                sub = _subset(frame, ids)
                target[ids] = stage.target(sub)
                gripper[ids] = stage.gripper
                reached = np.linalg.norm(sub.ee - target[ids], axis=-1) < stage.tol
                waited = self.count[ids] + 1 >= stage.wait if stage.wait else np.zeros(ids.size, bool)
                advance = (reached | waited) & (k + 1 < len(stages))
                self.count[ids] = np.where(advance, 0, self.count[ids] + 1)
                self.phase[ids] += advance
        move = np.clip((target - ctrl_target) / POS_SCALE, -1.0, 1.0)
        turn = np.clip(
            rotation_error(np.broadcast_to(R_DOWN, ctrl_rot.shape), ctrl_rot) / ROT_SCALE, -1.0, 1.0
        )
        return np.concatenate([move, turn, gripper[:, None]], -1).astype(np.float32)

    def _realign_pushes(self, f: TaskFrame) -> None:
        """A push that drifted off the cube-goal line starts over from behind the cube."""
        d = _push_dir(f)[:, :2]
        rel = f.ee[:, :2] - f.main[:, :2]
        lateral = np.abs(rel[:, 0] * d[:, 1] - rel[:, 1] * d[:, 0])
        lost = (f.task == _PUSH) & (self.phase == 2) & (lateral > PUSH_MAX_LATERAL)
        self.phase[lost] = 0
        self.count[lost] = 0


def _subset(f: TaskFrame, ids: np.ndarray) -> TaskFrame:
    return TaskFrame(*(getattr(f, k)[ids] for k in TaskFrame.__dataclass_fields__))
