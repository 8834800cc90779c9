"""Keyboard teleop: key -> action mapping, takeover toggling, non-blocking reads, cbreak on a pty."""

import os
import pty
import select
import termios

import numpy as np
import pytest

from embodrl.deploy.commands import deploy
from embodrl.deploy.config import DeployConfig, TeleopConfig
from embodrl.deploy.teleop import KeyboardTeleop, keyboard_teleop, read_available
from embodrl.errors import UserError
from tests.deploy.fakes import FakeRobot


def teleop(typed: list[str], action_dim: int = 7, ee_dims=(0, 1, 2), gripper_dim: int | None = -1):
    """A KeyboardTeleop that reads typed[i] at its i-th step."""
    keys = iter(typed)
    return KeyboardTeleop(action_dim, 0.5, ee_dims, gripper_dim, (-1.0, 1.0), lambda: next(keys))


def expected(x=0.0, y=0.0, z=0.0, gripper=-1.0) -> np.ndarray:
    return np.array([x, y, z, 0.0, 0.0, 0.0, gripper])


def test_keys_map_to_delta_actions_only_while_the_human_is_in_control():
    typed = ["w", "w\n", "", "w", "www", "sd", "QE", "a ", "e", "\r", "w"]
    hook = teleop(typed)
    actions = [hook({}) for _ in typed]
    assert actions[0] is None  # the policy is in control until Enter
    np.testing.assert_array_equal(actions[1], expected())  # presses before the takeover do not move
    np.testing.assert_array_equal(actions[2], expected())  # nothing pressed: hold still, gripper open
    np.testing.assert_array_equal(actions[3], expected(x=0.5))
    np.testing.assert_array_equal(actions[4], expected(x=0.5))  # key repeats never exceed one step
    np.testing.assert_array_equal(actions[5], expected(x=-0.5, y=-0.5))
    np.testing.assert_array_equal(actions[6], expected())  # Q up and E down cancel (either case)
    np.testing.assert_array_equal(actions[7], expected(y=0.5, gripper=1.0))  # space toggles the gripper
    np.testing.assert_array_equal(actions[8], expected(z=-0.5, gripper=1.0))  # and it stays toggled
    assert actions[9] is None and actions[10] is None  # Enter (raw mode's "\r") hands control back


def test_ee_and_gripper_dims_follow_the_safety_config():
    hook = teleop(["\nq "], action_dim=4, ee_dims=(3, 2, 1), gripper_dim=None)
    np.testing.assert_array_equal(hook({}), [0.0, 0.5, 0.0, 0.0])  # z is dim 1; no gripper dim
    with pytest.raises(UserError, match="ee_dims"):
        teleop([], action_dim=2)


def test_read_available_never_blocks():
    read_fd, write_fd = os.pipe()
    try:
        assert read_available(read_fd) == ""
        os.write(write_fd, b"wa\n")
        assert read_available(read_fd) == "wa\n"
        assert read_available(read_fd) == ""
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_terminal_is_in_cbreak_mode_while_open_and_restored_after():
    master, slave = pty.openpty()
    with os.fdopen(slave, "r") as terminal, os.fdopen(master, "wb", buffering=0) as keyboard:
        before = termios.tcgetattr(slave)
        with keyboard_teleop(DeployConfig(policy="local"), 7, terminal) as hook:
            lflag = termios.tcgetattr(slave)[3]
            assert not lflag & (termios.ICANON | termios.ECHO) and lflag & termios.ISIG  # Ctrl-C still works
            keyboard.write(b"\rw")  # the Enter key sends "\r"
            select.select([slave], [], [], 5.0)
            np.testing.assert_array_equal(hook({}), expected(x=0.5))
        assert termios.tcgetattr(slave) == before


def test_keyboard_teleop_needs_a_terminal():
    cfg = DeployConfig(policy="local", teleop=TeleopConfig(keyboard=True))
    with pytest.raises(UserError, match="interactive terminal"):
        deploy(cfg, robot=FakeRobot())  # pytest's stdin is not a terminal


def test_y_marks_the_task_done_without_taking_over():
    hook = teleop(["", "y", "", "y"])
    marks = []
    for _ in range(4):
        assert hook({}) is None  # the policy keeps control
        marks.append(hook.success_marked)
    assert marks == [False, True, True, False]
