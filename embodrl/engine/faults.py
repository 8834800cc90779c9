"""Retrying a rollout whose env worker failed: the worker rebuilt its envs, the iteration starts over."""

from __future__ import annotations

import logging

import torch

from embodrl.engine.env_client import EnvWorkerError
from embodrl.engine.schedules import InitialStates, Rollout, Schedule

log = logging.getLogger(__name__)


def collect_with_retries(
    schedule: Schedule, initial_states: InitialStates, generator: torch.Generator, max_retries: int
) -> tuple[Rollout, int]:
    """A rollout and the number of failed attempts before it.

    Before a retry the initial-state generator and torch's global RNG are rewound, so the retried
    rollout starts from the same states and samples as the failed one would have.
    """
    snapshot = generator.get_state(), torch.get_rng_state()
    for attempt in range(max_retries + 1):
        try:
            return schedule.collect(initial_states), attempt
        except EnvWorkerError as error:
            if attempt == max_retries:
                raise
            log.warning("%s\nretrying the rollout (%d of %d)", error, attempt + 1, max_retries)
            generator.set_state(snapshot[0])
            torch.set_rng_state(snapshot[1])
    raise AssertionError("unreachable")
