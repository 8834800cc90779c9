"""A thread-safe stage timer: seconds spent per stage (env_step, inference, transfer, ...) per iteration."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class StageTimer:
    """Accumulates seconds per stage name until `pop`; the runner logs them as time/<stage>."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._totals[name] += seconds

    def pop(self) -> dict[str, float]:
        """The totals since the last pop, then start again from zero."""
        with self._lock:
            totals, self._totals = dict(self._totals), defaultdict(float)
        return totals
