"""An actor's connection to its learner: an outbox of unacknowledged batches and the newest weights.

Acting does not wait on the network: `submit` puts a batch in the outbox and returns (unless the outbox
is full: then it waits for room, or with `drop_when_full` drops the oldest batch); a background thread
sends the oldest batch, removes it once the learner acknowledges it (the learner stores a batch durably
before it acknowledges it), and asks for newer weights every `pull_every_s`. When the learner is away the
thread reconnects with a doubling backoff and resends what is still unacknowledged; the learner drops
what it already holds by (actor id, sequence number). Needs only numpy, msgpack and websockets: the robot
side can stream its transitions with it.

    cfg = ActorConnectionConfig(learner="ws://gpu-box:8765", actor_id="robot-1", drop_when_full=True)
    client = LearnerClient(cfg)
    client.submit({"obs": {...}, "action": a, "reward": r, "next_obs": {...}, "terminated": t}, env_steps=n)
    if (weights := client.take_weights()) is not None: version, state = weights  # {name: array}
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.sync.client import ClientConnection, connect

from embodrl.deploy.config import API_KEY_VARIABLE
from embodrl.errors import UserError
from embodrl.remote.config import ActorConnectionConfig
from embodrl.remote.protocol import FINISHED, ProtocolError, expect, packb, unpackb

logger = logging.getLogger(__name__)
WAIT_SLICE_S = 0.5  # how often a submit waiting for room checks whether the connection thread failed


class LearnerError(UserError):
    """The learner cannot be reached, refused the connection (a wrong API key) or rejected a batch."""


class LearnerRefused(LearnerError):
    """The learner answered the connection with an HTTP error (a wrong API key): retrying will not help."""


@dataclass
class _Batch:
    seq: int
    frame: bytes  # the packed "batch" message, resent as it is
    count: int


@dataclass
class ClientStats:
    """Counters since start (read by the acting loop for its status line)."""

    submitted: int = 0  # batches
    acked: int = 0  # batches the learner stored (duplicates included)
    acked_transitions: int = 0
    duplicates: int = 0  # resent batches the learner already held
    dropped: int = 0  # unacknowledged batches pushed out of a full outbox
    reconnects: int = 0
    last_acked_seq: int = -1


class LearnerClient:
    """Connects at once (waiting up to `wait_s` for the learner to start) and keeps the connection up."""

    def __init__(self, cfg: ActorConnectionConfig) -> None:
        self.cfg = cfg
        self._headers = {"Authorization": f"Api-Key {cfg.api_key}"} if cfg.api_key else None
        self.stats = ClientStats()
        self.error: LearnerError | None = None  # what stopped the thread; raised by the next `submit`
        self.finished = False  # the learner ran all its iterations: nothing more to send
        self._outbox: deque[_Batch] = deque()
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # notified when the outbox shrinks
        self._wake, self._closing = threading.Event(), threading.Event()
        self._new_weights: tuple[int, dict[str, np.ndarray]] | None = None
        self._backoff = cfg.reconnect_s
        self._ws: ClientConnection | None = self._open(cfg.wait_s)
        welcome = self._hello()
        self.policy_spec: dict = welcome[
            "policy"
        ]  # {family, policy, obs_shapes, read_keys}: the weights' policy
        self._have: tuple[str, int] = ("", 0)  # the learner run and version of the newest weights received
        self._next_seq = welcome["last_seq"] + 1  # a restarted actor continues its numbering
        self._thread = threading.Thread(target=self._run, name="embodrl-learner-client", daemon=True)
        self._thread.start()

    # ---- the acting side ---------------------------------------------------------------------------
    def submit(
        self,
        transitions: dict[str, Any],
        env_steps: int,
        episodes: dict[str, float] | None = None,
        wait: bool = True,
    ) -> int | None:
        """Queue a batch of transitions (arrays [B, ...], protocol.py) for the learner; returns its sequence
        number. `episodes`: the mean outcomes of the episodes that ended in it ({"episodes": count, "return":
        mean, "success": mean, ...}), which the learner logs as rollout/*. A full outbox makes it wait for
        room (or drop the oldest batch: `drop_when_full`); with `wait` false it then queues nothing and
        returns None (an actor that is stopping), as it does once the learner `finished`. Raises the error
        that stopped the connection thread, if one did."""
        if self.error is not None:
            raise self.error
        if self.finished:
            return None
        count = len(transitions["reward"])
        with self._room:
            if not wait and len(self._outbox) >= self.cfg.max_unacked_batches and not self.cfg.drop_when_full:
                return None
            seq, self._next_seq = self._next_seq, self._next_seq + 1
        message = {
            "type": "batch",
            "actor": self.cfg.actor_id,
            "seq": seq,
            "env_steps": env_steps,
            "transitions": transitions,
        }
        frame = packb(message if episodes is None else {**message, "episodes": episodes})
        with self._room:
            while len(self._outbox) >= self.cfg.max_unacked_batches and not self.cfg.drop_when_full:
                if self.error is not None:
                    raise self.error
                if self._closing.is_set():
                    raise LearnerError(f"the connection to {self.cfg.learner} is closed")
                if self.finished:
                    return None
                self._room.wait(WAIT_SLICE_S)
            if len(self._outbox) >= self.cfg.max_unacked_batches:
                self._outbox.popleft()
                self.stats.dropped += 1
                logger.warning(
                    "outbox full (%d batches): dropped the oldest unacknowledged one", len(self._outbox)
                )
            self._outbox.append(_Batch(seq, frame, count))
            self.stats.submitted += 1
        self._wake.set()
        return seq

    def take_weights(self) -> tuple[int, dict[str, np.ndarray]] | None:
        """(version, state dict of arrays) received since the last call, or None."""
        with self._lock:
            weights, self._new_weights = self._new_weights, None
        return weights

    @property
    def unacked(self) -> int:
        return len(self._outbox)

    @property
    def connected(self) -> bool:
        return self._ws is not None

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for every queued batch to be acknowledged; whether they all were."""
        deadline = time.monotonic() + timeout_s
        while self._outbox and self.error is None and not self.finished and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._outbox

    def close(self) -> None:
        """Stop the thread (a reply it waits for is cut short) and close the connection."""
        self._closing.set()
        self._wake.set()
        if self._ws is not None:
            self._ws.close()  # thread-safe in websockets: ends a recv the thread is blocked in
        self._thread.join(timeout=self.cfg.timeout_s)
        self._ws = None

    def __enter__(self) -> LearnerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the connection ----------------------------------------------------------------------------
    def _open(self, wait_s: float) -> ClientConnection:
        uri, deadline = self.cfg.learner, time.monotonic() + wait_s
        while True:  # keep knocking while the learner starts (up to wait_s)
            try:
                connection = connect(
                    uri,
                    compression=None,
                    max_size=self.cfg.max_message_bytes,
                    additional_headers=self._headers,
                    open_timeout=self.cfg.timeout_s,
                )
                return connection.__enter__()  # the documented context-manager use; closed by _lose/close
            except InvalidURI as error:
                raise LearnerError(f"{uri} is not a websocket address (ws://host:port)") from error
            except InvalidStatus as error:
                status = error.response.status_code
                hint = (
                    f": missing or wrong API key (set {API_KEY_VARIABLE} to the learner's)"
                    if status == 401
                    else ""
                )
                raise LearnerRefused(f"{uri} refused the connection (HTTP {status}){hint}") from error
            except InvalidHandshake as error:
                raise LearnerRefused(
                    f"{uri} is not a learner (the websocket handshake failed: {error})"
                ) from error
            except (OSError, TimeoutError) as error:
                if time.monotonic() >= deadline:
                    reason = getattr(error, "strerror", None) or type(error).__name__
                    raise LearnerError(
                        f"cannot connect to {uri}: {reason} (is `embodrl learner` running there?)"
                    ) from None
                time.sleep(0.2)

    def _request(self, message: dict) -> dict:
        self._ws.send(packb(message))
        reply = self._ws.recv(timeout=self.cfg.timeout_s)
        if isinstance(reply, str):  # the learner's refusal
            raise LearnerError(f"the learner refused: {reply.removeprefix('error: ')}")
        return unpackb(reply)

    def _hello(self) -> dict:
        welcome = expect(self._request({"type": "hello", "actor": self.cfg.actor_id}), "welcome")
        logger.info("connected to learner %s at %s", welcome["learner"], self.cfg.learner)
        return welcome

    def _reconnect(self) -> None:
        self._closing.wait(self._backoff)
        if self._closing.is_set():
            return
        try:
            self._ws = self._open(0.0)
            welcome = self._hello()
        except LearnerRefused:
            raise
        except (LearnerError, ConnectionClosed, OSError, TimeoutError, ProtocolError):
            if self._ws is not None:
                self._ws.close()
            self._ws, self._backoff = None, min(2 * self._backoff, self.cfg.max_reconnect_s)
            return
        if welcome["policy"] != self.policy_spec:
            raise LearnerError(f"the learner at {self.cfg.learner} came back training another policy")
        with self._lock:  # stored before the connection broke, only the acknowledgement was lost
            while self._outbox and self._outbox[0].seq <= welcome["last_seq"]:
                self._outbox.popleft()
            self._room.notify_all()
        self._backoff = self.cfg.reconnect_s
        self.stats.reconnects += 1

    def _lose(self, error: Exception) -> None:
        logger.warning(
            "lost the learner at %s (%s); acting on, resending on reconnect", self.cfg.learner, error
        )
        if self._ws is not None:
            self._ws.close()
        self._ws = None

    def _run(self) -> None:
        next_pull = 0.0
        try:
            while not self._closing.is_set():
                if self._ws is None:
                    self._reconnect()
                    continue
                try:
                    self._wake.clear()
                    sent = self._send_oldest()
                    if time.monotonic() >= next_pull:
                        self._pull()
                        next_pull = time.monotonic() + self.cfg.pull_every_s
                    if not sent:
                        self._wake.wait(max(0.0, next_pull - time.monotonic()))
                except (ConnectionClosed, OSError, TimeoutError, ProtocolError) as error:
                    if self._closing.is_set():
                        break
                    if isinstance(error, ConnectionClosed) and error.rcvd and error.rcvd.reason == FINISHED:
                        logger.info("%s at %s", FINISHED, self.cfg.learner)
                        self.finished = True
                        break
                    self._lose(error)
        except LearnerError as error:
            logger.error("%s", error)
            self.error = error

    def _send_oldest(self) -> bool:
        with self._lock:
            batch = self._outbox[0] if self._outbox else None
        if batch is None:
            return False
        self._ws.send(batch.frame)
        reply = self._ws.recv(timeout=self.cfg.timeout_s)
        if isinstance(reply, str):
            raise LearnerError(f"the learner refused batch {batch.seq}: {reply.removeprefix('error: ')}")
        ack = expect(unpackb(reply), "ack")
        if ack["seq"] != batch.seq:
            raise ProtocolError(f"acknowledgement of batch {ack['seq']} while batch {batch.seq} waits")
        with self._lock:
            if self._outbox and self._outbox[0] is batch:  # not pushed out of a full outbox meanwhile
                self._outbox.popleft()
                self._room.notify_all()
            self.stats.acked += 1
            self.stats.acked_transitions += batch.count
            self.stats.duplicates += bool(ack["duplicate"])
            self.stats.last_acked_seq = batch.seq
        return True

    def _pull(self) -> None:
        learner, version = self._have
        reply = expect(self._request({"type": "pull", "learner": learner, "version": version}), "weights")
        if "state" in reply:
            with self._lock:
                self._new_weights = (reply["version"], reply["state"])
            self._have = (reply["learner"], reply["version"])
