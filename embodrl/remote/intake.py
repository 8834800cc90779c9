"""Where the learner's server hands batches to its trainer: stored durably first, then queued (bounded).

`store` runs on the server's side and returns only once the batch is in the transition log (so the
acknowledgement that follows is a promise), syncing outside the queue's lock; the trainer `take`s the
queued batches into its replay buffer. The per-actor last sequence number drops resent batches.
`rotate`, called by the trainer before a checkpoint, hands over what is queued and starts a new log
segment in one step, so the checkpoint's buffer holds exactly the records before that segment.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from embodrl.remote.transition_log import TransitionLog

WAIT_SLICE_S = 0.5  # how often a store waiting for room checks whether the learner is closing


@dataclass
class Arrival:
    """A stored batch: its transitions (arrays [B, ...]), the env steps they took and the outcomes of the
    episodes that ended in it (protocol.py's `episodes`, or None)."""

    transitions: dict[str, Any]
    env_steps: int
    episodes: dict[str, float] | None = None


class LearnerClosing(ConnectionError):
    """The learner is shutting down: the batch was not stored."""


class Intake:
    """The transition log, the queue of stored batches (at most `max_pending`) and each actor's last seq."""

    def __init__(self, log: TransitionLog, last_seq: dict[str, int], max_pending: int) -> None:
        self.log, self.max_pending = log, max_pending
        self._last_seq = dict(last_seq)
        self._pending: list[Arrival] = []
        self._changed = threading.Condition()  # the queue and the last seqs
        # the log and what it holds beyond the queue: a store's append and queueing, or a rotation, at once;
        # held while syncing, so the trainer (which takes from the queue) never waits for the disk
        self._logging = threading.Lock()
        self._closed = False

    def last_seq(self, actor: str) -> int:
        """The last sequence number stored from `actor` (-1: none)."""
        with self._changed:
            return self._last_seq.get(actor, -1)

    def _duplicate(self, actor: str, seq: int) -> bool:
        return seq <= self._last_seq.get(actor, -1)

    def store(self, actor: str, seq: int, record: bytes, arrival: Arrival) -> bool:
        """Log `record` (the batch message as received) and queue `arrival`, waiting while the queue is full;
        returns True, storing nothing, when the batch is a duplicate."""
        with self._changed:  # room first, outside the log's lock: the trainer's rotate may be waiting for it
            while len(self._pending) >= self.max_pending:
                if self._closed:
                    raise LearnerClosing("the learner is shutting down")
                self._changed.wait(WAIT_SLICE_S)
        with self._logging:
            with self._changed:
                if self._closed:
                    raise LearnerClosing("the learner is shutting down")
                if self._duplicate(actor, seq):
                    return True
            self.log.append(record)
            with self._changed:
                self._pending.append(arrival)
                self._last_seq[actor] = seq
                self._changed.notify_all()
            return False

    def take(self, wait_s: float = 0.0) -> list[Arrival]:
        """The queued batches (waiting up to `wait_s` for one when none is)."""
        with self._changed:
            if not self._pending and wait_s > 0:
                self._changed.wait(wait_s)
            arrivals, self._pending = self._pending, []
            self._changed.notify_all()
            return arrivals

    def rotate(self) -> tuple[list[Arrival], int, dict[str, int]]:
        """The queued batches, the new log segment's number and the last sequence numbers, at one instant."""
        with self._logging, self._changed:
            arrivals, self._pending = self._pending, []
            segment = self.log.rotate()
            self._changed.notify_all()
            return arrivals, segment, dict(self._last_seq)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        with self._logging:
            self.log.close()
