"""Scripted experts: per task a list of waypoint stages, run as a state machine per env.

Each stage names a target for the controller's target point, a gripper command, and when it is
done (hand within `tol` of the target, or after `wait` steps); the last stage holds. Actions
steer the controller's target (not the lagging hand) so the arm never overshoots a waypoint.

A waypoint above the next one (over the cube before the descent) is also done once the hand is under it,
level within `xy_tol`: a hand that came in low beside the cube goes on down, not back up. The expert's
own path meets its waypoints within `tol` before it could pass under them; another driver's (a policy
played under DAgger) need not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from embodrl.sims.tabletop.controller import POS_SCALE, R_DOWN, ROT_SCALE, euler_to_matrix, rotation_error
from embodrl.sims.tabletop.rewards import TaskFrame
from embodrl.sims.tabletop.scene import CUBE_HALF
from embodrl.sims.tabletop.tasks import TASK_NAMES

OPEN, CLOSED = -1.0, 1.0
GRASP_DZ = 0.005  # grasp 5 mm above the cube centre so the pads clear the table
CARRY_Z = 0.17
PUSH_BACKOFF = 0.07  # m behind the cube where a push starts
PUSH_CONTACT = 0.038  # m from cube centre to the hand when touching it
PUSH_MAX_LATERAL = 0.02  # m off the push line before the expert lifts and realigns
LOST_GRASP = 0.05  # m between hand and cube while carrying: the cube was dropped, grasp again
HELD_LIFT = 0.01  # m above its resting height: a cube near the hand and this high is in the hand

Target = Callable[[TaskFrame], np.ndarray]


@dataclass(frozen=True)
class Stage:
    target: Target
    gripper: float
    tol: float = 0.0  # done when the hand is this close (0: never)
    wait: int = 0  # done after this many steps (0: never)
    # also done when the hand is this close horizontally and more than `tol` under the target (0: never);
    # the expert's own path reaches `tol` first, so its demos are as without the rule
    xy_tol: float = 0.0


def _offset(base: Callable[[TaskFrame], np.ndarray], dx=0.0, dy=0.0, dz=0.0) -> Target:
    return lambda f: base(f) + np.array([dx, dy, dz])


def _at_height(base: Callable[[TaskFrame], np.ndarray], z: float) -> Target:
    return lambda f: np.concatenate([base(f)[:, :2], np.full((len(f.task), 1), z)], -1)


def _main(f: TaskFrame) -> np.ndarray:
    return f.main


def _goal(f: TaskFrame) -> np.ndarray:
    return f.goal


def _goal_under_held(f: TaskFrame) -> np.ndarray:
    """Where the hand must be for the held cube to be over the goal: the goal plus the grasp offset."""
    offset = f.ee - f.main
    offset[:, 2] = 0.0
    return f.goal + offset


def _push_dir(f: TaskFrame) -> np.ndarray:
    d = f.goal[:, :2] - f.main[:, :2]
    d = d / np.maximum(np.linalg.norm(d, axis=-1, keepdims=True), 1e-6)
    return np.concatenate([d, np.zeros((len(d), 1))], -1)


def _behind(height: float, dist: float) -> Target:
    return lambda f: _at_height(_main, height)(f) - dist * _push_dir(f)


def _grasp(lift: Stage) -> list[Stage]:
    return [
        Stage(_offset(_main, dz=0.08), OPEN, tol=0.015, xy_tol=0.01),
        Stage(_offset(_main, dz=GRASP_DZ), OPEN, tol=0.007),
        Stage(_offset(_main, dz=GRASP_DZ), CLOSED, wait=5),
        lift,
    ]


def _carry_to(goal_dz: float) -> list[Stage]:
    return [
        Stage(_at_height(_goal_under_held, CARRY_Z), CLOSED, tol=0.015, xy_tol=0.01),
        Stage(_offset(_goal_under_held, dz=goal_dz), CLOSED, tol=0.008),
        Stage(_offset(_goal_under_held, dz=goal_dz), OPEN, wait=4),
        Stage(_offset(_goal, dz=0.12), OPEN),
    ]


STAGES: dict[str, list[Stage]] = {
    "reach": [Stage(_main, OPEN)],
    "push": [
        Stage(_behind(0.08, PUSH_BACKOFF), CLOSED, tol=0.015, xy_tol=0.01),
        Stage(_behind(CUBE_HALF, PUSH_BACKOFF), CLOSED, tol=0.006),
        Stage(_behind(CUBE_HALF, PUSH_CONTACT - 0.04), CLOSED),  # aim 4 cm into the cube: it slides
    ],
    "pick": _grasp(Stage(_at_height(_main, 0.2), CLOSED)),
    "place": _grasp(Stage(_at_height(_main, CARRY_Z), CLOSED, tol=0.03)) + _carry_to(0.045),
    "stack": _grasp(Stage(_at_height(_main, CARRY_Z), CLOSED, tol=0.03))
    + _carry_to(2 * CUBE_HALF + GRASP_DZ + 0.006),
    "press": [
        Stage(_offset(_main, dz=0.06), CLOSED, tol=0.01, xy_tol=0.01),
        Stage(_offset(_main, dz=-0.006), CLOSED),
    ],
}
_PUSH = TASK_NAMES.index("push")
_GRASPING = np.array([TASK_NAMES.index(t) for t in ("pick", "place", "stack")])
_CARRY_PHASES = (3, 4, 5)  # lift, over the goal, lower: the cube must be in the hand


def _cube_yaw(f: TaskFrame) -> np.ndarray:
    """[N] yaw of the main cube folded into [-45, 45) deg: a square face-to-face grasp is 90-deg periodic."""
    w, z = f.main_quat[:, 0], f.main_quat[:, 3]
    yaw = 2.0 * np.arctan2(z, w)
    return (yaw + np.pi / 4) % (np.pi / 2) - np.pi / 4


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
        self._regrasp_drops(frame)
        self._carry_on_grasps(frame)
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
                if stage.xy_tol:
                    level = np.linalg.norm(sub.ee[:, :2] - target[ids, :2], axis=-1) < stage.xy_tol
                    reached |= level & (sub.ee[:, 2] < target[ids, 2] - stage.tol)
                waited = self.count[ids] + 1 >= stage.wait if stage.wait else np.zeros(ids.size, bool)
                advance = (reached | waited) & (k + 1 < len(stages))
                self.count[ids] = np.where(advance, 0, self.count[ids] + 1)
                self.phase[ids] += advance
        move = np.clip((target - ctrl_target) / POS_SCALE, -1.0, 1.0)
        turn = np.clip(
            rotation_error(self._wanted_rotation(frame, ctrl_rot), ctrl_rot) / ROT_SCALE, -1.0, 1.0
        )
        # The expert turns about the vertical only. Its roll and pitch stay exactly zero even where another
        # driver (a policy played under DAgger) tilted the hand slightly: demos hold them constant, so a
        # policy normalizes them by a zero spread, and any label there would be magnified without bound.
        turn[:, :2] = 0.0
        return np.concatenate([move, turn, gripper[:, None]], -1).astype(np.float32)

    def _wanted_rotation(self, f: TaskFrame, ctrl_rot: np.ndarray) -> np.ndarray:
        """[N, 3, 3]: pointing down; before a grasp also turned to the cube's faces, then held."""
        grasping = np.isin(f.task, _GRASPING)
        yaw = np.where(grasping, _cube_yaw(f), 0.0)
        wanted = euler_to_matrix(np.stack([np.zeros_like(yaw), np.zeros_like(yaw), yaw], -1)) @ R_DOWN
        carrying = grasping & (self.phase >= 3)  # the cube turns with the hand: keep the grasp's yaw
        wanted[carrying] = ctrl_rot[carrying]
        return wanted

    def _realign_pushes(self, f: TaskFrame) -> None:
        """A push that drifted off the cube-goal line starts over from behind the cube."""
        d = _push_dir(f)[:, :2]
        rel = f.ee[:, :2] - f.main[:, :2]
        lateral = np.abs(rel[:, 0] * d[:, 1] - rel[:, 1] * d[:, 0])
        lost = (f.task == _PUSH) & (self.phase == 2) & (lateral > PUSH_MAX_LATERAL)
        self.phase[lost] = 0
        self.count[lost] = 0

    def _regrasp_drops(self, f: TaskFrame) -> None:
        """A cube that left the hand while being carried is picked up again."""
        lost = np.isin(f.task, _GRASPING) & np.isin(self.phase, _CARRY_PHASES) & ~_at_hand(f)
        self.phase[lost] = 0
        self.count[lost] = 0

    def _carry_on_grasps(self, f: TaskFrame) -> None:
        """A cube already lifted in the hand before the expert's own grasp (another driver grasped it, a
        policy under DAgger) is carried on: the expert does not send the hand back down to grasp it again."""
        taken = np.isin(f.task, _GRASPING) & (self.phase < _CARRY_PHASES[0]) & _held(f)
        self.phase[taken] = _CARRY_PHASES[0]
        self.count[taken] = 0


def _at_hand(f: TaskFrame) -> np.ndarray:
    """[N] the main cube is within grasping distance of the hand."""
    return np.linalg.norm(f.ee - f.main, axis=-1) < LOST_GRASP


def _held(f: TaskFrame) -> np.ndarray:
    """[N] the main cube is in the hand: at hand and off the table."""
    return _at_hand(f) & (f.main[:, 2] > CUBE_HALF + HELD_LIFT)


def _subset(f: TaskFrame, ids: np.ndarray) -> TaskFrame:
    return TaskFrame(*(getattr(f, k)[ids] for k in TaskFrame.__dataclass_fields__))
