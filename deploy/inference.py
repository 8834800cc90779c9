"""Where the control loop gets chunks: a local runner or a remote server, queried off the loop thread.

Both sources take the same request (openpi keys) and check it the same way, so a policy behaves the
same in-process and behind `embodrl serve`.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from embodrl.deploy.client import PolicyClient, ServerError
from embodrl.deploy.config import ObservationKeys
from embodrl.deploy.guidance import to_runner_observation
from embodrl.deploy.runner import PolicyRunner

logger = logging.getLogger(__name__)
TRANSIENT_ERRORS = (ServerError, OSError, TimeoutError)  # the loop holds and carries on (watchdog decides)


class ChunkSource(Protocol):
    """A policy as the loop sees it."""

    action_horizon: int
    action_dim: int
    guided_chunks: bool  # whether requests with the previous chunk's actions get guided chunks

    def infer(self, request: dict[str, Any]) -> np.ndarray:
        """An action chunk [H, A] for one request."""


class LocalPolicy:
    """A PolicyRunner in this process (no server)."""

    def __init__(self, runner: PolicyRunner, keys: ObservationKeys) -> None:
        self.runner, self.keys = runner, keys
        self.action_horizon, self.action_dim = runner.action_horizon, runner.action_dim
        self.input_names = tuple(runner.input_spec)
        self.guided_chunks = runner.guided_chunks

    def infer(self, request: dict[str, Any]) -> np.ndarray:
        return self.runner.infer_batch([to_runner_observation(request, self.keys, self.runner)])[0]


class RemotePolicy:
    """A policy behind `embodrl serve` or any openpi server (sizes it does not report are 0: unknown)."""

    def __init__(self, client: PolicyClient) -> None:
        self.client = client
        self.action_horizon = int(client.metadata.get("action_horizon", 0))
        self.action_dim = int(client.metadata.get("action_dim", 0))
        self.input_names = tuple(client.metadata.get("inputs", {}))  # () from servers that do not say
        self.guided_chunks = bool(client.metadata.get("guided_chunks", False))  # openpi servers: no

    def infer(self, request: dict[str, Any]) -> np.ndarray:
        return np.asarray(self.client.infer(request)["actions"])


class BackgroundInference:
    """At most one inference in flight on a worker thread; results carry the step of their observation."""

    def __init__(self, source: ChunkSource) -> None:
        self.source = source
        # Requests run one at a time (a client's connection is not shared), each on a daemon thread: an
        # inference that hangs never keeps the process alive after the episodes end.
        self._one_at_a_time = threading.Lock()
        self._closed = False
        self._future: Future | None = None
        self._obs_step = 0
        self.errors = 0

    @property
    def busy(self) -> bool:
        return self._future is not None

    def submit(self, request: dict[str, Any], obs_step: int) -> None:
        if self.busy:
            raise RuntimeError("an inference is already in flight")
        future: Future = Future()

        def run() -> None:
            with self._one_at_a_time:
                if self._closed or not future.set_running_or_notify_cancel():
                    return
                try:
                    future.set_result(self.source.infer(request))
                except BaseException as error:  # noqa: BLE001 - handed to the loop through the future
                    future.set_exception(error)

        threading.Thread(target=run, name="embodrl-deploy-infer", daemon=True).start()
        self._future, self._obs_step = future, obs_step

    def wait(self, timeout_s: float) -> None:
        """Block until the in-flight inference finishes or `timeout_s` passes."""
        if self._future is not None and timeout_s > 0:
            try:
                self._future.exception(timeout=timeout_s)
            except TimeoutError:
                pass

    def poll(self) -> tuple[np.ndarray, int] | None:
        """The finished chunk [H, A] and its observation step, or None (still running, none, or failed)."""
        if self._future is None or not self._future.done():
            return None
        future, self._future = self._future, None
        try:
            return np.asarray(future.result()), self._obs_step
        except TRANSIENT_ERRORS as error:
            self.errors += 1
            logger.warning("inference failed, holding: %s", error)
            return None

    def discard(self) -> None:
        """Forget the in-flight inference (a new episode starts); its result will be ignored."""
        self._future = None

    def close(self) -> None:
        """Start no more requests; one in flight is abandoned (its daemon thread never blocks the exit)."""
        self._closed = True
        if self._future is not None:
            self._future.cancel()
