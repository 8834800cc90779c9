"""Retrying a rollout whose env worker failed: the worker rebuilt its envs, the iteration starts over.

Ranks in lockstep (FSDP: every forward all-gathers) cannot stop a rollout on their own: a rank whose
env worker fails goes on with placeholder steps (`StagedEnv.fail_soft`) so that its forwards still
pair with the other ranks', then every rank learns of the failure from one all-reduce and all of
them retry the rollout together.
"""

from __future__ import annotations

import logging

import torch

from embodrl.engine.env_client import EnvWorkerError
from embodrl.engine.schedules import CollectedRollout, InitialStates, Schedule
from embodrl.parallel.distributed import sum_tensor_over_ranks

log = logging.getLogger(__name__)


class OtherRankFailed(EnvWorkerError):
    """Another rank's env worker failed during this rollout, so every rank retries it."""

    def __init__(self, failed_ranks: int) -> None:
        RuntimeError.__init__(self, f"{failed_ranks} other rank(s) lost this rollout to a failed env worker")
        self.stage = -1


def collect_with_retries(
    schedule: Schedule, initial_states: InitialStates, generator: torch.Generator, max_retries: int
) -> tuple[CollectedRollout, int]:
    """A rollout and the number of this rank's env worker failures before it.

    Before a retry the initial-state generator and torch's global RNG are rewound, so the retried
    rollout starts from the same states and samples as the failed one would have.
    """
    snapshot = generator.get_state(), torch.get_rng_state()
    failures = 0
    for attempt in range(max_retries + 1):
        try:
            return _collect(schedule, initial_states), failures
        except EnvWorkerError as error:
            failures += not isinstance(error, OtherRankFailed)
            if attempt == max_retries:
                raise
            log.warning("%s\nretrying the rollout (%d of %d)", error, attempt + 1, max_retries)
            generator.set_state(snapshot[0])
            torch.set_rng_state(snapshot[1])
    raise AssertionError("unreachable")


def _collect(schedule: Schedule, initial_states: InitialStates) -> CollectedRollout:
    if not schedule.inference.lockstep:
        return schedule.collect(initial_states)
    env = schedule.env
    env.fail_soft = True  # during the rollout only: an evaluation on this env must see its errors
    try:
        rollout = schedule.collect(initial_states)
    finally:
        env.fail_soft = False
    failure = env.take_failure()
    failed_ranks = int(sum_tensor_over_ranks(torch.tensor([float(failure is not None)])).item())
    if failed_ranks:
        schedule.discard()  # its last observations are placeholders (here or on the failed rank)
        raise failure or OtherRankFailed(failed_ranks)
    return rollout
