"""Keyboard teleoperation: a human takes over `embodrl deploy` from the terminal (`teleop.keyboard=true`).

Keys, for delta end-effector actions (the tabletop sim's [dx, dy, dz, ..., gripper]):
    w / s  +x / -x      a / d  +y / -y      q / e  +z / -z      (the action dims `safety.ee_dims`)
    space  toggle the gripper between safety.gripper_low (the start) and safety.gripper_high
    Enter  take over from the policy; Enter again hands control back
    y      mark the task done from this step on (y again unmarks): the recording's success label
While the human is in control, each loop step sends the motion of the keys read since the previous
step (a held key repeats; an axis moves at most `teleop.step` per step; nothing pressed holds still)
and the loop marks the step `teleop` in the recording. The safety layer filters these actions too.

The terminal runs in cbreak mode (keys arrive one by one, unechoed) rather than full raw mode, so
Ctrl-C still raises KeyboardInterrupt and reaches the loop's safe stop. `embodrl deploy` opens it when
`teleop.keyboard=true`; in Python, `with keyboard_teleop(cfg, action_dim) as hook:` gives the hook for
`ControlLoop(..., intervention=hook)`.
"""

from __future__ import annotations

import logging
import os
import select
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import numpy as np

from embodrl.deploy.config import RobotLoopConfig
from embodrl.errors import UserError

logger = logging.getLogger(__name__)

MOTION_KEYS = {"w": (0, 1.0), "s": (0, -1.0), "a": (1, 1.0), "d": (1, -1.0), "q": (2, 1.0), "e": (2, -1.0)}
GRIPPER_KEY, SUCCESS_KEY, TAKEOVER_KEYS = (
    " ",
    "y",
    ("\n", "\r"),
)  # cbreak delivers Enter as "\n", raw mode as "\r"
HELP = "teleop: Enter takes over / hands back; w/s x, a/d y, q/e z, space gripper; y marks the task done"


class KeyboardTeleop:
    """The intervention hook: keys -> a delta action [A] while a human is in control, else None."""

    def __init__(
        self,
        action_dim: int,
        step: float,
        ee_dims: tuple[int, int, int],
        gripper_dim: int | None,
        gripper_values: tuple[float, float],
        read_keys: Callable[[], str],
    ) -> None:
        if len(ee_dims) != 3 or any(not -action_dim <= d < action_dim for d in ee_dims):
            raise UserError(
                f"safety.ee_dims={list(ee_dims)} must name 3 action dims of the robot's {action_dim}"
            )
        self.action_dim, self.step, self.read_keys = action_dim, step, read_keys
        self.ee_dims = tuple(d % action_dim for d in ee_dims)
        self.gripper_dim = None if gripper_dim is None else gripper_dim % action_dim
        self.gripper_values = gripper_values  # (start, toggled)
        self.gripper_closed = False
        self.in_control = False
        self.success_marked = False  # the operator says the task is done (recorded as next.reward)
        self.motion = np.zeros(3)  # [3] key presses per axis since the last step

    def press(self, keys: str) -> None:
        """Apply keys in the order typed (unknown keys are ignored; letters in either case)."""
        for key in keys.lower():
            if key in MOTION_KEYS:
                axis, sign = MOTION_KEYS[key]
                self.motion[axis] += sign
            elif key == GRIPPER_KEY:
                self.gripper_closed = not self.gripper_closed
            elif key == SUCCESS_KEY:
                self.success_marked = not self.success_marked
                logger.warning("teleop: task %s", "done" if self.success_marked else "not done")
            elif key in TAKEOVER_KEYS:
                self.in_control = not self.in_control
                self.motion[:] = 0.0  # presses made before the takeover do not move the arm
                logger.warning("teleop: %s in control", "human" if self.in_control else "policy")

    def action(self) -> np.ndarray | None:
        """This step's action [A] (and the motion consumed) while a human is in control, else None."""
        motion, self.motion = self.motion, np.zeros(3)
        if not self.in_control:
            return None
        action = np.zeros(self.action_dim)
        action[list(self.ee_dims)] = self.step * np.clip(motion, -1.0, 1.0)
        if self.gripper_dim is not None:
            action[self.gripper_dim] = self.gripper_values[int(self.gripper_closed)]
        return action

    def __call__(self, observation: dict[str, Any]) -> np.ndarray | None:
        self.press(self.read_keys())
        return self.action()


def read_available(fd: int) -> str:
    """Every key waiting on file descriptor `fd`, without blocking ("" when none)."""
    chunks = []
    while select.select([fd], [], [], 0)[0]:
        data = os.read(fd, 64)
        if not data:  # end of input
            break
        chunks.append(data.decode(errors="ignore"))
    return "".join(chunks)


@contextmanager
def keyboard_teleop(
    cfg: RobotLoopConfig, action_dim: int, stream: TextIO | None = None
) -> Iterator[KeyboardTeleop]:
    """A KeyboardTeleop reading the terminal `stream` (stdin) in cbreak mode, restored on exit."""
    import termios
    import tty

    stream = stream or sys.stdin
    if not stream.isatty():
        raise UserError("teleop.keyboard needs an interactive terminal on stdin; run embodrl deploy from one")
    fd, safety = stream.fileno(), cfg.safety
    teleop = KeyboardTeleop(
        action_dim,
        cfg.teleop.step,
        safety.ee_dims,
        safety.gripper_dim,
        (safety.gripper_low, safety.gripper_high),
        lambda: read_available(fd),
    )
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    logger.warning(HELP)
    try:
        yield teleop
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
