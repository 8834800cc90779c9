"""Safety layer: NaN never reaches the robot, clamps hold, chunks are validated, the watchdog fires."""

import numpy as np
import pytest

from embodrl.deploy.config import SafetyConfig
from embodrl.deploy.safety import SafetyLayer, Watchdog, WatchdogState
from embodrl.errors import ConfigError, UserError

A = 4  # 3 arm dims + gripper (last)


def _layer(**overrides) -> SafetyLayer:
    return SafetyLayer(SafetyConfig(**{"max_relative_target": None, **overrides}), action_dim=A, fps=10.0)


def test_non_finite_actions_become_hold():
    layer = _layer()
    layer.reset(np.array([0.0, 0.0, 0.0, 0.8]))
    for bad in (np.array([np.nan, 0, 0, 0]), np.array([0, np.inf, 0, 0]), None, np.zeros(7)):
        out = layer.filter(bad)
        assert np.all(np.isfinite(out))
        np.testing.assert_array_equal(out, [0.0, 0.0, 0.0, 0.8])  # delta hold: zeros, gripper kept
    assert layer.counters.non_finite_actions == 3  # None is "no action", not a bad one


def test_random_garbage_never_leaves_bounds_or_rate_limits():
    rng = np.random.default_rng(0)
    layer = _layer(max_relative_target=(0.1,), gripper_low=-0.5, gripper_high=0.5)
    previous = np.zeros(A)
    for _ in range(500):
        raw = rng.normal(0, 5, A) * rng.choice([1, np.nan, np.inf], p=[0.8, 0.1, 0.1], size=A)
        out = layer.filter(raw)
        assert np.all(np.isfinite(out)) and np.all(np.abs(out[:3]) <= 1.0) and abs(out[3]) <= 0.5
        if np.all(np.isfinite(raw)):
            assert np.all(np.abs(out[:3] - previous[:3]) <= 0.1 + 1e-12)
        else:  # held at once: zero motion, gripper unchanged
            np.testing.assert_array_equal(out, [0, 0, 0, previous[3]])
        previous = out
    counts = layer.counters
    assert counts.bounds_clamps > 0 and counts.rate_clamps > 0 and counts.gripper_clamps > 0
    assert counts.non_finite_actions > 0


def test_velocity_and_acceleration_limits():
    layer = _layer(max_velocity=(2.0,), max_acceleration=(10.0,), action_type="absolute")  # fps 10
    outs = [layer.filter(np.array([1.0, 0, 0, 0]))[0] for _ in range(8)]
    steps = np.diff([0.0, *outs])
    assert np.all(steps <= 0.2 + 1e-12)  # 2 units/s at 10 Hz
    assert np.all(np.abs(np.diff([0.0, *steps])) <= 0.1 + 1e-12)  # 10 units/s^2 -> 0.1 per step^2
    assert outs[-1] == pytest.approx(1.0) and layer.counters.rate_clamps > 0


def test_gripper_is_exempt_from_rate_limits():
    layer = _layer(max_relative_target=(0.05,))
    assert layer.filter(np.array([0, 0, 0, 1.0]))[3] == 1.0


def test_workspace_box_delta_and_absolute():
    box = {"workspace_low": (0.0, 0.0, 0.0), "workspace_high": (0.5, 0.5, 0.5)}
    delta = _layer(**box, ee_delta_scale=0.1)
    out = delta.filter(np.array([1.0, -1.0, 0.2, 0.0]), ee_position=np.array([0.45, 0.05, 0.2]))
    np.testing.assert_allclose(out[:3], [0.5, -0.5, 0.2])  # stops exactly at the walls
    assert delta.counters.workspace_clamps == 1
    with pytest.raises(ConfigError, match="EE position"):
        delta.filter(np.zeros(A))
    absolute = _layer(**box, action_type="absolute", action_low=(-2.0,), action_high=(2.0,))
    np.testing.assert_allclose(absolute.filter(np.array([0.9, 0.2, -0.3, 0.0]))[:3], [0.5, 0.2, 0.0])


def test_chunk_validation():
    layer = _layer(max_chunk_jump=0.5)
    assert layer.check_chunk(np.zeros((4, A)))
    assert not layer.check_chunk(np.full((4, A), np.nan))
    assert not layer.check_chunk(np.zeros((4, A + 1)))
    assert not layer.check_chunk(np.array([[0.9, 0, 0, 0]] * 4))  # jumps from the last action (0)
    assert layer.check_chunk(np.array([[0.0, 0, 0, 1.0]] * 4))  # gripper may jump
    assert layer.counters.rejected_chunks == 3


def test_watchdog_hold_then_stop():
    dog = Watchdog(hold_s=0.2, stop_s=1.0)
    assert dog.check(10.0) is WatchdogState.OK
    dog.feed(10.0)
    assert dog.check(10.1) is WatchdogState.OK
    assert dog.check(10.25) is WatchdogState.HOLD
    assert dog.check(11.0) is WatchdogState.STOP
    dog.feed(11.0)
    assert dog.check(11.05) is WatchdogState.OK


def test_config_checks():
    with pytest.raises(ConfigError, match="one per action dim"):
        SafetyLayer(SafetyConfig(action_low=(-1.0, -1.0)), action_dim=A, fps=10)
    with pytest.raises(ConfigError, match="hold first"):
        SafetyConfig(watchdog_hold_s=2.0, watchdog_stop_s=1.0)


def test_absolute_targets_start_from_the_present_position():
    layer = _layer(action_type="absolute", max_relative_target=(0.1,))
    layer.reset(np.array([0.8, -0.3, 0.1, np.nan]))  # the gripper is not observed
    np.testing.assert_allclose(layer.filter(None), [0.8, -0.3, 0.1, 0.0])  # hold where it is, not at 0
    np.testing.assert_allclose(layer.filter(np.zeros(A))[:3], [0.7, -0.2, 0.0])  # rate-limited from there
    with pytest.raises(UserError, match="present position"):
        layer.reset(np.array([np.nan, 0.0, 0.0, 0.0]))
