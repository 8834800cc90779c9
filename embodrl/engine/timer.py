"""A thread-safe stage timer: seconds spent per stage (env_step, inference, transfer, ...) per iteration."""

from __future__ import annotations

import threading
import time
from collections import defaultdict


class StageTimer:
    """Accumulates seconds per stage name until `pop`; the runner logs them as time/<stage>."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    def stage(self, name: str) -> _Span:
        """Times the `with` block under `name`."""
        return _Span(self, name)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._totals[name] += seconds

    def pop(self) -> dict[str, float]:
        """The totals since the last pop, then start again from zero."""
        with self._lock:
            totals, self._totals = dict(self._totals), defaultdict(float)
        return totals


class _Span:
    """`StageTimer.stage`'s context manager: a class, because a generator-based one costs ~2 us more,
    paid at every decision of a one-env rollout."""

    __slots__ = ("timer", "name", "start")

    def __init__(self, timer: StageTimer, name: str) -> None:
        self.timer, self.name = timer, name

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timer.add(self.name, time.perf_counter() - self.start)
