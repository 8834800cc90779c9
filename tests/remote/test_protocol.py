"""What the learner checks of a batch before it stores it: the transitions' keys, shapes and dtypes, and the
episode summary."""

from __future__ import annotations

import math

import numpy as np
import pytest

from embodrl.remote.protocol import ProtocolError, check_outcomes, check_transitions

SHAPES = {"state": (3,)}


def transitions(count: int = 2) -> dict:
    state = np.zeros((count, 3), np.float32)
    return {
        "obs": {"state": state},
        "action": np.zeros((count, 1, 2), np.float32),
        "reward": np.zeros(count, np.float32),
        "next_obs": {"state": state},
        "terminated": np.zeros(count, bool),
    }


def test_a_batch_shaped_as_the_policy_reads_is_counted():
    assert check_transitions(transitions(5), SHAPES, (1, 2)) == 5
    flagged = {**transitions(5), "intervention": np.array([True, False, False, True, False])}
    assert check_transitions(flagged, SHAPES, (1, 2)) == 5  # the steps a human drove


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t["obs"].update(rgb=t["obs"]["state"]), r"transitions\[obs\] holds \['rgb', 'state'\]"),
        (lambda t: t.update(reward=np.zeros(3, np.float32)), r"reward\] is shaped \[3\], expected \[2\]"),
        (lambda t: t.update(action=np.zeros((2, 1, 2), np.float64)), "action] is float64, expected float32"),
        (lambda t: t.update(terminated=np.zeros(2, np.float32)), "terminated] is float32, expected bool"),
        (lambda t: t["next_obs"].update(state=np.array([["a"] * 3] * 2)), "expected numbers"),
        (lambda t: t.pop("next_obs"), "expected \\['action', 'next_obs'"),
        (lambda t: t.update(intervention=np.zeros(2, np.float32)), "intervention] is float32, expected bool"),
        (lambda t: t.update(driver=np.zeros(2, bool)), "optionally \\['intervention'\\]"),
    ],
)
def test_a_batch_that_differs_is_refused_saying_how(change, message):
    batch = transitions()
    change(batch)
    with pytest.raises(ProtocolError, match=message):
        check_transitions(batch, SHAPES, (1, 2))


def test_an_empty_batch_is_refused():
    with pytest.raises(ProtocolError, match="at least one transition"):
        check_transitions(transitions(0), SHAPES, (1, 2))


def test_episode_summaries_are_finite_numbers_with_a_count():
    assert check_outcomes({"episodes": 2.0, "return": -3.5, "success": 0.5})
    for bad in ({"episodes": 0.0}, {"episodes": 1, "return": math.nan}, {"episodes": 1, "x": "y"}, [1.0]):
        with pytest.raises(ProtocolError, match="finite numbers"):
            check_outcomes(bad)
