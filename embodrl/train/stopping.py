"""Stopping a training loop on Ctrl-C or SIGTERM at the end of the current iteration, not inside it.

An RL iteration (rollout, then many optimizer steps) can take minutes. Stopped inside one, the
checkpoint would hold weights part-way through an update and an RNG that has moved on, under the
previous iteration's number: the resumed run would not be the uninterrupted one. So the first signal
only asks to stop; the loop finishes the iteration, logs and saves it, then raises. A second signal
stops at once, as before (the checkpoint is then written from wherever the loop was).
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType, TracebackType

import torch
import torch.distributed as dist

from embodrl.errors import Terminated
from embodrl.parallel.distributed import sum_tensor_over_ranks

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopAtIterationEnd:
    """Context manager for a training loop, which asks `requested()` where its state is consistent."""

    def __init__(self, what: str) -> None:
        self.what = what  # "iteration", "step": for the message
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopAtIterationEnd:
        if threading.current_thread() is threading.main_thread():  # only there can handlers be set
            for signum in SIGNALS:
                # A signal the process ignores (SIGINT of a background job of a script) stays ignored.
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            raise interruption(signum)
        self.received = signum
        name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
        print(
            f"\n{name}: stopping after this {self.what}, once it is saved ({name} again to stop now)",
            file=sys.stderr,
            flush=True,
        )

    def requested(self) -> bool:
        """Whether a stop was asked for; with torch.distributed, True on every rank when any rank was
        signalled (a collective call: every rank asks at the same point, so none is left waiting)."""
        stop = self.received is not None
        if dist.is_initialized() and dist.get_world_size() > 1:
            asked = torch.tensor([float(self.received or 0)])
            stop = bool(sum_tensor_over_ranks(asked).item() > 0)
            if stop and self.received is None:
                self.received = signal.SIGTERM  # another rank's signal: the launcher is tearing down
        return stop

    def interruption(self) -> KeyboardInterrupt:
        """The exception to stop with once `requested()`."""
        return interruption(self.received if self.received is not None else signal.SIGINT)


def interruption(signum: int) -> KeyboardInterrupt:
    """Ctrl-C's KeyboardInterrupt, or its Terminated subclass for SIGTERM (the CLI exits 130 or 143)."""
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
