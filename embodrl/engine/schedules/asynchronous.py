"""Async schedule (AReaL / PipelineRL): rollouts continue on a background thread while the actor trains.

Rollout b (the b-th one `collect` returns) is consumed by update b, i.e. by the actor at weight
version b. Before the producer starts rollout b it waits until version b - max_staleness has been
pushed, and weights pushed during a rollout are applied between decisions (in-flight update), so
every sample is at most max_staleness versions old. Samples carry their version; the update
corrects for the gap with the decoupled objective (embodrl.algos). max_staleness=0 makes the
producer wait for every update: the synchronous loop, step for step.
"""

from __future__ import annotations

import queue
import threading

from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.engine.schedules.base import CollectedRollout, InitialStates, Schedule, SyncSchedule


class AsyncSchedule(Schedule):
    """Runs a synchronous schedule (sequential or pipelined) on a producer thread, ahead of the actor."""

    def __init__(self, inner: SyncSchedule, max_staleness: int) -> None:
        super().__init__(inner.env, inner.inference, inner.buffer, inner.continue_episodes)
        if inner.inference.shared:
            raise ValueError("the async schedule needs an inference worker with its own copy of the policy")
        self.inner, self.max_staleness = inner, max_staleness
        self._results: queue.Queue[CollectedRollout | BaseException] = queue.Queue()
        self._thread: threading.Thread | None = None

    def collect(self, initial_states: InitialStates) -> CollectedRollout:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._produce, args=(initial_states,), daemon=True, name="async-rollout"
            )
            self._thread.start()
        item = self._results.get()
        if isinstance(item, BaseException):
            self._thread.join()
            self._thread = None  # the next collect starts a new producer (after a retried failure)
            raise item
        return item

    def _produce(self, initial_states: InitialStates) -> None:
        batch = self.inference.latest_version  # rollouts before it were consumed (a resumed run starts later)
        try:
            while self.inference.wait_for_version(batch - self.max_staleness):
                # a fresh buffer per rollout: the actor may still be training on the previous one
                shape = (self.buffer.num_steps, self.buffer.num_envs)
                self.inner.buffer = RolloutBuffer(*shape, device=self.buffer.device)
                self._results.put(self.inner.collect(initial_states))
                batch += 1
        except BaseException as e:  # handed to the consumer, which raises it in the training thread
            self._results.put(e)

    def close(self) -> None:
        super().close()
        if self._thread is not None:
            self._thread.join(timeout=60)
