"""The actor <-> learner messages: msgpack maps with a "type", numpy arrays in deploy's msgpack-numpy format.

actor -> learner                                   learner -> actor
  {"type": "hello", "actor": id}                     {"type": "welcome", "learner": run id, "last_seq": n,
                                                      "version": v, "policy": {family, policy, obs_shapes,
                                                                               read_keys}}
  {"type": "batch", "actor": id, "seq": n,           {"type": "ack", "seq": n, "duplicate": bool}
   "env_steps": k, "transitions": {...},
   "episodes": {...} (optional)}
  {"type": "pull", "learner": run id, "version": v}  {"type": "weights", "learner": run id, "version": v,
                                                      "state": {name: array}}  (no "state": unchanged)

A batch the learner cannot take is answered with a text frame "error: <reason>". A learner that ran all
its iterations closes every connection with reason FINISHED (its actors stop); any other close means
the learner is away (its actors reconnect). `transitions` holds
arrays [B, ...]: "obs" and "next_obs" (maps of the policy's observation keys), "action" [B, C, A] float32,
"reward" [B] float32, "terminated" [B] bool, and optionally "intervention" [B] bool (a human or scripted
expert drove that step: the learner keeps it in its demo buffer too). `episodes` sums up the episodes that
ended in the batch:
{"episodes": count, "return": mean, "length": mean, "success": mean, <the env's flags>: mean}. Sequence
numbers count each actor's batches from 0; the learner keeps the last one it stored per actor, so a
batch sent again after a reconnect is acknowledged as a duplicate and dropped. Weights version 0 means
none yet: actors then act uniformly at random.
Only numpy, msgpack and the standard library are imported here (the robot side depends on it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from embodrl.deploy.protocol import ProtocolError, packb, unpackb

__all__ = [
    "FINISHED",
    "ProtocolError",
    "check_actor_id",
    "check_outcomes",
    "check_transitions",
    "expect",
    "packb",
    "unpackb",
]

OBSERVATIONS = ("obs", "next_obs")
FIXED_DTYPES = {"action": np.float32, "reward": np.float32, "terminated": np.bool_}
OPTIONAL_FLAGS = ("intervention",)  # [B] bool, sent by actors whose steps a human may drive
MAX_ID_LENGTH = 64
FINISHED = "the learner finished its run"  # the close reason that stops actors
MAX_OUTCOMES = 32  # entries of a batch's episode summary


def expect(message: Any, kind: str) -> dict:
    """`message` as a map of type `kind`, or a ProtocolError."""
    if not isinstance(message, dict) or message.get("type") != kind:
        got = message.get("type") if isinstance(message, dict) else type(message).__name__
        raise ProtocolError(f"expected a {kind!r} message, got {got!r}")
    return message


def check_actor_id(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH or not value.isprintable():
        raise ProtocolError(f"an actor id is a printable string of 1 to {MAX_ID_LENGTH} characters")
    return value


def check_transitions(
    transitions: Any, obs_shapes: dict[str, tuple[int, ...]], chunk: tuple[int, int]
) -> int:
    """The number of transitions in a batch shaped as the policy reads them (observation keys and shapes
    `obs_shapes`, action chunks `chunk` [C, A]); a ProtocolError saying what differs otherwise."""
    if not isinstance(transitions, dict):
        raise ProtocolError("transitions must be a map")
    count = None

    def check(name: str, array: Any, shape: tuple[int, ...], dtype: type | None) -> None:
        nonlocal count
        if not isinstance(array, np.ndarray):
            raise ProtocolError(f"transitions[{name}] must be an array")
        if count is None:
            count = array.shape[0] if array.ndim else 0
        if array.shape != (count, *shape):
            raise ProtocolError(
                f"transitions[{name}] is shaped {list(array.shape)}, expected {[count, *shape]}"
            )
        if dtype is not None and array.dtype != dtype:
            raise ProtocolError(f"transitions[{name}] is {array.dtype}, expected {np.dtype(dtype)}")
        if dtype is None and array.dtype.kind not in "biuf":
            raise ProtocolError(f"transitions[{name}] is {array.dtype}, expected numbers")

    expected = {*OBSERVATIONS, *FIXED_DTYPES}
    if not expected <= set(transitions) <= expected | set(OPTIONAL_FLAGS):
        raise ProtocolError(
            f"transitions hold {sorted(transitions)}, expected {sorted(expected)} (and optionally "
            f"{list(OPTIONAL_FLAGS)})"
        )
    for group in OBSERVATIONS:
        observations = transitions[group]
        if not isinstance(observations, dict) or set(observations) != set(obs_shapes):
            keys = sorted(observations) if isinstance(observations, dict) else observations
            raise ProtocolError(f"transitions[{group}] holds {keys}, expected {sorted(obs_shapes)}")
        for key, shape in obs_shapes.items():
            check(f"{group}][{key}", observations[key], tuple(shape), None)
    check("action", transitions["action"], tuple(chunk), FIXED_DTYPES["action"])
    check("reward", transitions["reward"], (), FIXED_DTYPES["reward"])
    check("terminated", transitions["terminated"], (), FIXED_DTYPES["terminated"])
    for flag in OPTIONAL_FLAGS:
        if flag in transitions:
            check(flag, transitions[flag], (), np.bool_)
    if not count:
        raise ProtocolError("a batch holds at least one transition")
    return count


def check_outcomes(outcomes: Any) -> dict[str, float]:
    """A batch's episode summary: short names to finite numbers, with a positive "episodes" count."""
    if (
        not isinstance(outcomes, dict)
        or not 0 < len(outcomes) <= MAX_OUTCOMES
        or not all(isinstance(k, str) and 0 < len(k) <= MAX_ID_LENGTH and k.isprintable() for k in outcomes)
        or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in outcomes.values()
        )
        or not outcomes.get("episodes", 0) > 0
    ):
        raise ProtocolError(
            f"episodes must map up to {MAX_OUTCOMES} names to finite numbers, with a positive 'episodes' "
            "count"
        )
    return outcomes
