"""Success and shaped progress of every tabletop task, vectorized over envs (numpy).

Dense reward is potential-based: progress(s') - progress(s) plus 1 on success, so shaping never
pays for dawdling and the optimal policy is the sparse one's (Ng et al. 1999).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embodrl.sims.tabletop.scene import CUBE_HALF
from embodrl.sims.tabletop.tasks import TASK_NAMES

LIFT_HEIGHT = 0.05  # m above the resting height counts as picked up
RELEASED_OPENING = 0.066  # m finger gap: wider than any grasp of a 4.5 cm cube at |yaw| <= 30 deg
PRESS_DEPTH = 0.008  # m of button travel counts as pressed
_T = {name: i for i, name in enumerate(TASK_NAMES)}


@dataclass
class TaskFrame:
    """What success and progress read, per env: positions [N, 3], button travel, finger gap [N]."""

    task: np.ndarray  # [N] index into TASK_NAMES
    ee: np.ndarray
    main: np.ndarray  # the object the instruction names first (its top for buttons)
    main_quat: np.ndarray  # [N, 4] its orientation (identity for all but cubes)
    goal: np.ndarray  # the second object (plate, bowl, lower cube); equals main when there is none
    button_travel: np.ndarray  # [N] how far the main button is pushed in (0 otherwise)
    gripper_gap: np.ndarray  # [N]


def _near(d: np.ndarray) -> np.ndarray:
    return 1.0 - np.tanh(5.0 * d)


def success(f: TaskFrame) -> np.ndarray:
    """[N] bool: the instruction is fulfilled."""
    xy = np.linalg.norm(f.main[:, :2] - f.goal[:, :2], axis=-1)
    dz = f.main[:, 2] - f.goal[:, 2]
    released = f.gripper_gap > RELEASED_OPENING
    per_task = {
        "reach": np.linalg.norm(f.ee - f.main, axis=-1) < 0.03,
        "push": (xy < 0.04) & (f.main[:, 2] < CUBE_HALF + 0.01),
        "pick": f.main[:, 2] > CUBE_HALF + LIFT_HEIGHT,
        "place": (xy < 0.04) & (f.main[:, 2] < 0.05) & released,
        "stack": (xy < 0.025) & (np.abs(dz - 2 * CUBE_HALF) < 0.01) & released,
        "press": f.button_travel > PRESS_DEPTH,
    }
    return np.select([f.task == _T[k] for k in per_task], list(per_task.values()), False)


def progress(f: TaskFrame) -> np.ndarray:
    """[N] in [0, 1]: a potential that grows as the task gets closer to done."""
    approach = _near(np.linalg.norm(f.ee - f.main, axis=-1))
    lift = np.clip((f.main[:, 2] - CUBE_HALF) / LIFT_HEIGHT, 0.0, 1.0)
    per_task = {
        "reach": approach,
        "push": 0.25 * approach + 0.75 * _near(np.linalg.norm(f.main[:, :2] - f.goal[:, :2], axis=-1)),
        "pick": 0.25 * approach + 0.75 * lift,
        "place": 0.25 * approach + 0.75 * _near(np.linalg.norm(f.main - f.goal - [0, 0, 0.03], axis=-1)),
        "stack": 0.25 * approach
        + 0.75 * _near(np.linalg.norm(f.main - f.goal - [0, 0, 2 * CUBE_HALF], axis=-1)),
        "press": 0.25 * approach + 0.75 * np.clip(f.button_travel / PRESS_DEPTH, 0.0, 1.0),
    }
    return np.select([f.task == _T[k] for k in per_task], list(per_task.values()), 0.0)
