"""`embodrl serve`: a websocket policy server speaking openpi's protocol.

On connect the server sends its metadata (msgpack); each binary frame is then a msgpack-numpy map of
observations and is answered with `{"actions": [H, A], "server_timing": {...}, "policy_timing":
{...}}`. A request the server cannot serve is answered with a text frame holding the reason (openpi
clients raise it as an error) and the connection stays open. Inference runs on one worker thread,
off the event loop, so `/healthz` and other clients are answered during a slow `act`; requests that
queue up while it runs are served together by one batched call. A request may carry the previous
chunk's unexecuted actions (deploy/guidance.py): a policy that can be guided continues them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import http
import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.server import Request, Response, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from embodrl.deploy.config import API_KEY_VARIABLE, ServerConfig
from embodrl.deploy.guidance import to_runner_observation
from embodrl.deploy.observations import RequestError
from embodrl.deploy.protocol import ProtocolError, packb, unpackb
from embodrl.deploy.runner import PolicyRunner
from embodrl.errors import UserError

logger = logging.getLogger(__name__)
PREPROCESS_THREADS = 2  # request decoding checks and image resizing, concurrent with inference


@dataclass
class _Pending:
    """A validated request waiting for the inference worker."""

    obs: dict[str, Any]
    future: asyncio.Future
    queued_at: float = field(default_factory=time.monotonic)

    @property
    def signature(self) -> tuple:
        """Requests with equal signatures can share one batched call (same keys)."""
        return tuple(sorted(self.obs))


@dataclass
class ServerStats:
    """Counters since start (read from other threads for monitoring and tests)."""

    requests: int = 0
    errors: int = 0
    batches: int = 0
    batched_requests: int = 0  # requests answered by a batch of size > 1


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def client(connection: ServerConnection) -> str:
    """host:port of a connection's client, for the log."""
    address = connection.remote_address
    return f"{address[0]}:{address[1]}" if address else "unknown client"


def health_or_refusal(connection: ServerConnection, request: Request, api_key: str | None) -> Response | None:
    """A websocket server's answer before the handshake: OK to /healthz, 401 to a request without
    `Authorization: Api-Key <api_key>` (when a key is set); None lets the handshake go on."""
    if request.path == "/healthz":
        return connection.respond(http.HTTPStatus.OK, "OK\n")
    if api_key is not None:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Api-Key {api_key}".encode()):
            logger.warning("refused a connection from %s: missing or wrong Api-Key", client(connection))
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong Api-Key\n")
    return None


class PolicyServer:
    """Serves a PolicyRunner over websockets; `serve_forever()` blocks, `with server:` runs it on a thread."""

    def __init__(self, runner: PolicyRunner, cfg: ServerConfig | None = None) -> None:
        self.runner, self.cfg = runner, cfg or ServerConfig()
        self.stats = ServerStats()
        self.port: int | None = None  # the bound port once started (cfg.port may be 0)
        wire_keys = dataclasses.asdict(self.cfg.keys)  # which request key feeds which input
        self._metadata = packb({**runner.metadata(), "observation_keys": wire_keys})
        self._start_error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    # ---- running -------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Serve until interrupted (Ctrl-C)."""
        asyncio.run(self._main(threading.Event()))

    def start(self) -> PolicyServer:
        """Serve on a background thread; returns once the port is bound."""
        started = threading.Event()
        self._thread = threading.Thread(target=self._run_thread, args=(started,), daemon=True)
        self._thread.start()
        started.wait(timeout=30)
        if self._start_error is not None:
            raise self._start_error
        if self.port is None:
            raise RuntimeError(
                f"the policy server did not start on {self.cfg.host}:{self.cfg.port} within 30 s"
            )
        return self

    def _run_thread(self, started: threading.Event) -> None:
        try:
            asyncio.run(self._main(started))
        except Exception as error:  # reported by start(); the thread just ends
            self._start_error = error
        finally:
            started.set()

    def stop(self) -> None:
        """Close the listener and every connection; pending requests are dropped."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    async def _main(self, started: threading.Event) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=self.cfg.max_pending)
        self._preprocess = ThreadPoolExecutor(PREPROCESS_THREADS, thread_name_prefix="embodrl-preprocess")
        self._infer = ThreadPoolExecutor(1, thread_name_prefix="embodrl-infer")  # the bounded worker
        worker = asyncio.create_task(self._batch_loop())
        try:
            server = await self._listen()
            async with server:
                self.port = server.sockets[0].getsockname()[1]
                logger.info("serving on %s:%d", self.cfg.host, self.port)
                if self.cfg.api_key is None and self.cfg.host not in LOOPBACK:
                    logger.warning(
                        "listening on %s without an API key: any machine that reaches this port can drive "
                        "the policy; set server.api_key or the %s variable",
                        self.cfg.host,
                        API_KEY_VARIABLE,
                    )
                started.set()
                await self._stop.wait()
        finally:
            worker.cancel()
            self._preprocess.shutdown(wait=False, cancel_futures=True)
            self._infer.shutdown(wait=False, cancel_futures=True)

    async def _listen(self):
        try:
            return await serve(
                self._handle,
                self.cfg.host,
                self.cfg.port,
                compression=None,
                max_size=self.cfg.max_message_bytes,
                process_request=self._process_request,
            )
        except OSError as error:
            where = f"{self.cfg.host}:{self.cfg.port}"
            raise UserError(
                f"cannot listen on {where} ({error.strerror}); choose another server.port"
            ) from error

    # ---- HTTP: health check and API key --------------------------------------------------------
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        return health_or_refusal(connection, request, self.cfg.api_key)

    # ---- one connection ------------------------------------------------------------------------
    async def _handle(self, ws: ServerConnection) -> None:
        await ws.send(self._metadata)
        prev_total_ms: float | None = None
        try:
            async for message in ws:
                start = time.monotonic()
                self.stats.requests += 1
                try:
                    reply = await self._answer(message)
                    if prev_total_ms is not None:
                        reply["server_timing"]["prev_total_ms"] = prev_total_ms
                    await ws.send(packb(reply))
                except TimeoutError:
                    self.stats.errors += 1
                    reason = f"no actions within server.request_timeout_s={self.cfg.request_timeout_s}"
                    logger.warning("refused a request from %s: %s", client(ws), reason)
                    await ws.send(f"error: {reason}")
                except (ProtocolError, RequestError, UserError, RuntimeError) as error:
                    self.stats.errors += 1
                    logger.warning("refused a request from %s: %s", client(ws), error)  # never the payload
                    await ws.send(f"error: {error}")
                except Exception as error:  # a request we failed to anticipate: answer it, keep serving
                    self.stats.errors += 1
                    logger.exception("unexpected error while answering a request")
                    await ws.send(f"error: internal server error ({type(error).__name__}: {error})")
                prev_total_ms = 1000 * (time.monotonic() - start)
        except ConnectionClosed:
            pass  # the client left mid-request

    async def _answer(self, message: str | bytes) -> dict[str, Any]:
        start = time.monotonic()
        if isinstance(message, str):
            raise ProtocolError("send observations as a binary msgpack frame, not text")
        request = unpackb(message)
        obs = await self._loop.run_in_executor(
            self._preprocess, to_runner_observation, request, self.cfg.keys, self.runner
        )
        pending = _Pending(obs, self._loop.create_future())
        try:
            self._queue.put_nowait(pending)
        except asyncio.QueueFull:
            raise RuntimeError(f"server busy: {self.cfg.max_pending} requests queued; retry later") from None
        try:
            actions, policy_timing = await asyncio.wait_for(pending.future, self.cfg.request_timeout_s)
        except TimeoutError:
            pending.future.cancel()  # the worker skips it if it has not started
            raise
        server_timing = {"infer_ms": policy_timing["infer_ms"], "total_ms": 1000 * (time.monotonic() - start)}
        return {"actions": actions, "server_timing": server_timing, "policy_timing": policy_timing}

    # ---- the inference worker ------------------------------------------------------------------
    async def _batch_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            deadline = self._loop.time() + self.cfg.batch_window_ms / 1000
            while len(batch) < self.cfg.max_batch_size:
                if not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                    continue
                remaining = deadline - self._loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:
                    break
            groups: dict[tuple, list[_Pending]] = defaultdict(list)
            for item in batch:
                if not item.future.done():  # timed out while queued
                    groups[item.signature].append(item)
            for group in groups.values():
                results = await self._loop.run_in_executor(self._infer, self._infer_group, group)
                for item, result in zip(group, results, strict=True):
                    if item.future.done():
                        continue
                    if isinstance(result, Exception):
                        item.future.set_exception(result)
                    else:
                        item.future.set_result(result)

    def _infer_group(self, group: list[_Pending]) -> list[tuple[np.ndarray, dict] | Exception]:
        """Run one batched call; if it fails, run each request alone so one bad request fails alone."""
        try:
            return self._infer_checked(group)
        except Exception as error:
            if len(group) == 1:
                return [_reply_error(error)]
        return [self._infer_one(item) for item in group]

    def _infer_one(self, item: _Pending) -> tuple[np.ndarray, dict] | Exception:
        try:
            return self._infer_checked([item])[0]
        except Exception as error:
            return _reply_error(error)

    def _infer_checked(self, group: list[_Pending]) -> list[tuple[np.ndarray, dict]]:
        start = time.monotonic()
        actions = np.asarray(self.runner.infer_batch([item.obs for item in group]), dtype=np.float32)
        infer_ms = 1000 * (time.monotonic() - start)
        expected = (len(group), self.runner.action_horizon, self.runner.action_dim)
        if actions.shape != expected:
            raise RuntimeError(
                f"the policy returned actions {list(actions.shape)}, expected {list(expected)}"
            )
        self.stats.batches += 1
        if len(group) > 1:
            self.stats.batched_requests += len(group)
        timing = {"infer_ms": infer_ms, "batch_size": len(group)}
        return [
            (actions[i], {**timing, "queue_ms": 1000 * (start - item.queued_at)})
            for i, item in enumerate(group)
        ]


def _reply_error(error: Exception) -> Exception:
    """What the client is told: user-caused errors as they are, anything else as a logged internal error."""
    if isinstance(error, UserError | RequestError):
        return error
    logger.error("inference failed", exc_info=error)
    return RuntimeError(f"inference failed: {type(error).__name__}: {error}")
