"""What a launcher returns for a started env worker, whatever runs it (thread, process, Ray actor, inline)."""

from __future__ import annotations

from abc import ABC, abstractmethod


class WorkerHandle(ABC):
    """A started worker."""

    @abstractmethod
    def alive(self) -> bool: ...

    @abstractmethod
    def describe_exit(self) -> str:
        """Why the worker is gone, for error messages."""

    @abstractmethod
    def join(self, timeout: float) -> None:
        """Wait for the worker to end; kill it (this worker only) if it does not."""
