"""The guided real-time chunking extension of a request: the previous chunk's unexecuted actions.

A client in `chunk.mode=guided_rtc` adds two optional keys to its openpi request: `prev_actions`
[L, A] float (robot units; row i is the action the previous chunk plans for the new chunk's step i,
L <= H) and `inference_delay` (d, the steps that will pass before the new chunk is used). A server
whose policy can be guided (metadata `guided_chunks: true`) inpaints toward them; other servers,
openpi's included, ignore unknown keys and sample unguided. Torch-free: the client imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from embodrl.deploy.config import ObservationKeys
from embodrl.deploy.observations import RequestError, to_observation
from embodrl.deploy.runner import GUIDANCE_KEY, PolicyRunner

PREV_ACTIONS_KEY = "prev_actions"
INFERENCE_DELAY_KEY = "inference_delay"


@dataclass(frozen=True)
class ChunkPrefix:
    """The previous chunk's actions for the new chunk's first L steps, and the inference delay d."""

    actions: np.ndarray  # [L, A] float32, robot units
    delay: int


def guidance_fields(prev_actions: list[np.ndarray], delay: int) -> dict[str, Any]:
    """The request keys for a plan's remaining actions (none when the plan is empty)."""
    if not prev_actions:
        return {}
    return {
        PREV_ACTIONS_KEY: np.asarray(prev_actions, dtype=np.float32),
        INFERENCE_DELAY_KEY: np.int64(min(delay, len(prev_actions))),
    }


def read_prefix(request: dict[str, Any], horizon: int, action_dim: int) -> ChunkPrefix | None:
    """The request's guidance keys, checked (None when it has none); RequestError if malformed."""
    if PREV_ACTIONS_KEY not in request:
        return None
    actions = request[PREV_ACTIONS_KEY]
    if not isinstance(actions, np.ndarray) or actions.dtype.kind not in "iuf" or actions.ndim != 2:
        raise RequestError(f"{PREV_ACTIONS_KEY!r} must be a numeric array [L, A]")
    if actions.shape[0] > horizon or actions.shape[1] != action_dim:
        raise RequestError(
            f"{PREV_ACTIONS_KEY!r} has shape {list(actions.shape)}; expected at most {horizon} rows of "
            f"{action_dim} actions"
        )
    if not np.all(np.isfinite(actions)):
        raise RequestError(f"{PREV_ACTIONS_KEY!r} holds NaN or inf")
    delay = request.get(INFERENCE_DELAY_KEY, 0)
    if not isinstance(delay, int | np.integer) or isinstance(delay, bool) or delay < 0:
        raise RequestError(f"{INFERENCE_DELAY_KEY!r} must be a non-negative integer; got {delay!r}")
    return ChunkPrefix(actions.astype(np.float32), int(delay))


def to_runner_observation(request: Any, keys: ObservationKeys, runner: PolicyRunner) -> dict[str, Any]:
    """`to_observation`, plus the request's chunk prefix under GUIDANCE_KEY when the runner can use it."""
    obs = to_observation(request, keys, runner.input_spec)
    if runner.guided_chunks:
        prefix = read_prefix(request, runner.action_horizon, runner.action_dim)
        if prefix is not None:
            obs[GUIDANCE_KEY] = prefix
    return obs
