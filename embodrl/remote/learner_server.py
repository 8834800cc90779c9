"""The learner's websocket server: welcomes actors, stores and acknowledges their batches, serves weights.

It runs its event loop on a background thread while the trainer runs on the main one. A batch is checked
against the policy's observation keys and shapes, then stored (Intake.store: logged and synced) on a
worker thread, and only then acknowledged. Weights are packed once per version (`publish`) and sent to
every actor that holds another version or another learner run's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from embodrl.deploy.server import LOOPBACK, client, health_or_refusal
from embodrl.errors import UserError
from embodrl.remote.config import LearnerServerConfig
from embodrl.remote.intake import Arrival, Intake, LearnerClosing
from embodrl.remote.protocol import (
    FINISHED,
    ProtocolError,
    check_actor_id,
    check_outcomes,
    check_transitions,
    packb,
    unpackb,
)

logger = logging.getLogger(__name__)
START_TIMEOUT_S = 30


class LearnerServer:
    """Serves `intake` and the published weights of the policy `spec` ({family, policy, obs_shapes,
    read_keys}: what an actor builds the policy from) as learner run `learner_id`; `with server:` runs it
    on a thread."""

    def __init__(self, cfg: LearnerServerConfig, intake: Intake, spec: dict, learner_id: str) -> None:
        self.cfg, self.intake, self.spec, self.learner_id = cfg, intake, spec, learner_id
        policy = spec["policy"]
        self._obs_shapes = {key: tuple(spec["obs_shapes"][key]) for key in spec["read_keys"]}
        self._chunk = (policy["chunk_size"], policy["action_dim"])
        self._weights = (0, packb({"type": "weights", "learner": learner_id, "version": 0}))
        self.port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._start_error: BaseException | None = None
        self._finished = False

    def publish(self, version: int, state: dict[str, np.ndarray]) -> None:
        """Serve `state` as weights `version` from now on."""
        message = {"type": "weights", "learner": self.learner_id, "version": version, "state": state}
        self._weights = (version, packb(message))  # one assignment: handlers see the old or the new pair

    # ---- running -----------------------------------------------------------------------------------
    def start(self) -> LearnerServer:
        started = threading.Event()
        self._thread = threading.Thread(target=self._run_thread, args=(started,), daemon=True)
        self._thread.start()
        started.wait(START_TIMEOUT_S)
        if self._start_error is not None:
            raise self._start_error
        if self.port is None:
            raise RuntimeError(f"the learner did not start listening within {START_TIMEOUT_S} s")
        return self

    def stop(self, finished: bool = False) -> None:
        """Close the listener and every connection: with `finished`, telling the actors to stop (protocol's
        FINISHED); otherwise they reconnect to the learner's next start."""
        self._finished = self._finished or finished
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=START_TIMEOUT_S)
            self._thread = None
        self._loop = None  # closed: a second stop has nothing to do

    def __enter__(self) -> LearnerServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _run_thread(self, started: threading.Event) -> None:
        try:
            asyncio.run(self._main(started))
        except Exception as error:  # reported by start()
            self._start_error = error
        finally:
            started.set()

    async def _main(self, started: threading.Event) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._storer = ThreadPoolExecutor(1, thread_name_prefix="embodrl-intake")  # appends in arrival order
        try:
            try:
                server = await serve(
                    self._handle,
                    self.cfg.host,
                    self.cfg.port,
                    compression=None,
                    max_size=self.cfg.max_message_bytes,
                    process_request=lambda connection, request: health_or_refusal(
                        connection, request, self.cfg.api_key
                    ),
                )
            except OSError as error:
                raise UserError(
                    f"cannot listen on {self.cfg.host}:{self.cfg.port} ({error.strerror}); "
                    "choose another --port"
                ) from error
            async with server:
                self.port = server.sockets[0].getsockname()[1]
                logger.info("learner %s listening on %s:%d", self.learner_id, self.cfg.host, self.port)
                if self.cfg.api_key is None and self.cfg.host not in LOOPBACK:
                    logger.warning(
                        "listening on %s without an API key: anyone who reaches it can feed the learner",
                        self.cfg.host,
                    )
                started.set()
                await self._stop.wait()
                if self._finished:  # (leaving `async with` closes with "going away" otherwise)
                    server.close(code=CloseCode.NORMAL_CLOSURE, reason=FINISHED)
        finally:
            self._storer.shutdown(wait=False, cancel_futures=True)

    # ---- one actor ---------------------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        actor: str | None = None
        try:
            async for message in ws:
                try:
                    if isinstance(message, str):
                        raise ProtocolError("send msgpack binary frames, not text")
                    request = unpackb(message)
                    kind = request.get("type") if isinstance(request, dict) else None
                    if kind == "hello":
                        actor = check_actor_id(request.get("actor"))
                        logger.info("actor %s connected from %s", actor, client(ws))
                        await ws.send(self._welcome(actor))
                    elif kind == "batch":
                        await ws.send(await self._store(actor, request, message))
                    elif kind == "pull":
                        version, weights = self._weights
                        if (request.get("learner"), request.get("version")) == (self.learner_id, version):
                            weights = packb(
                                {"type": "weights", "learner": self.learner_id, "version": version}
                            )
                        await ws.send(weights)
                    else:
                        raise ProtocolError(f"unknown message type {kind!r}")
                except ProtocolError as error:
                    logger.warning("refused a message from %s: %s", client(ws), error)  # never the payload
                    await ws.send(f"error: {error}")
        except ConnectionClosed:
            pass  # the actor left (it resends what was not acknowledged)
        except LearnerClosing:  # its batch is not stored: no reply; stop() closes, saying whether finished
            await ws.wait_closed()

    def _welcome(self, actor: str) -> bytes:
        version = self._weights[0]
        return packb(
            {
                "type": "welcome",
                "learner": self.learner_id,
                "last_seq": self.intake.last_seq(actor),
                "version": version,
                "policy": self.spec,
            }
        )

    async def _store(self, actor: str | None, request: dict, message: bytes) -> bytes:
        if actor is None or request.get("actor") != actor:
            raise ProtocolError("say hello with this actor id before sending batches")
        seq, env_steps = request.get("seq"), request.get("env_steps")
        if not isinstance(seq, int) or seq < 0 or not isinstance(env_steps, int) or env_steps < 0:
            raise ProtocolError("a batch carries a non-negative int seq and env_steps")
        transitions = request.get("transitions")
        check_transitions(transitions, self._obs_shapes, self._chunk)
        episodes = request.get("episodes")
        arrival = Arrival(transitions, env_steps, None if episodes is None else check_outcomes(episodes))
        duplicate = await self._loop.run_in_executor(
            self._storer, self.intake.store, actor, seq, message, arrival
        )
        return packb({"type": "ack", "seq": seq, "duplicate": duplicate})
