"""Robot-side client of `embodrl serve` (or any openpi policy server): needs only numpy, msgpack, websockets.

with PolicyClient("ws://gpu-box:8000", api_key=...) as policy:
    chunk = policy.infer({"observation/image": rgb, "observation/state": q, "prompt": "..."})["actions"]
"""

from __future__ import annotations

import logging
import time
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from embodrl.deploy.protocol import packb, unpackb
from embodrl.errors import UserError

logger = logging.getLogger(__name__)


class ServerError(UserError):
    """The server refused a request (its reason is the message), dropped the connection or cannot be
    reached; uncaught, a one-line error."""


class PolicyClient:
    """A connection to a policy server: `metadata` from the handshake, then `infer(obs)` per request.

    A lost connection (the server restarted, a reply came too late) is opened again by the next `infer`,
    with a backoff between tries (`reconnect_s` doubling up to `max_reconnect_s`); until then each `infer`
    raises a ServerError at once, so the robot's loop holds instead of waiting. A server that comes back
    with another action chunk shape is refused.
    """

    def __init__(
        self,
        uri: str,
        api_key: str | None = None,
        wait_s: float = 0.0,
        request_timeout_s: float = 30.0,
        max_message_bytes: int | None = 64 * 2**20,
        reconnect_s: float = 0.5,
        max_reconnect_s: float = 5.0,
    ) -> None:
        self.uri = uri if uri.startswith(("ws://", "wss://")) else f"ws://{uri}"
        self.request_timeout_s, self.max_message_bytes = request_timeout_s, max_message_bytes
        self._headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
        self._first_backoff, self._max_backoff = reconnect_s, max_reconnect_s
        self._backoff, self._retry_at = reconnect_s, 0.0
        self._ws: ClientConnection | None = None
        self._connect(wait_s)
        self.metadata: dict = self._receive()

    def _connect(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while True:  # like openpi's client: keep knocking while the server starts (up to wait_s)
            try:
                connection = connect(
                    self.uri,
                    compression=None,
                    max_size=self.max_message_bytes,
                    additional_headers=self._headers,
                )
                self._ws = connection.__enter__()  # the documented context-manager use
                return
            except InvalidStatus as error:
                status = error.response.status_code
                hint = "; pass the server's api_key" if status == 401 else ""
                raise ServerError(f"{self.uri} refused the connection (HTTP {status}){hint}") from error
            except (ConnectionRefusedError, TimeoutError, OSError) as error:
                if time.monotonic() >= deadline:
                    reason = error.strerror or type(error).__name__
                    raise ServerError(
                        f"cannot connect to {self.uri}: {reason} (is `embodrl serve` running there?)"
                    ) from None
                time.sleep(0.2)

    def _reconnect(self) -> None:
        """Open the connection again if the backoff allows; a ServerError while it cannot."""
        now = time.monotonic()
        if self._retry_at == float("inf"):
            raise ServerError(f"the client of {self.uri} is closed")
        if now < self._retry_at:
            raise ServerError(f"reconnecting to {self.uri} (next try in {self._retry_at - now:.1f} s)")
        try:
            self._connect(0.0)
            metadata = self._receive()
        except ServerError:
            self._ws, self._retry_at = None, now + self._backoff
            self._backoff = min(2 * self._backoff, self._max_backoff)
            raise
        shape = ("action_horizon", "action_dim")
        if any(metadata.get(k) != self.metadata.get(k) for k in shape):
            self.close()
            raise ServerError(
                f"{self.uri} came back serving chunks {[metadata.get(k) for k in shape]}, not "
                f"{[self.metadata.get(k) for k in shape]}: another policy"
            )
        self._backoff = self._first_backoff
        logger.info("reconnected to %s", self.uri)

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """Send one observation map; returns {"actions": [H, A], "server_timing", "policy_timing"}."""
        if self._ws is None:
            self._reconnect()
        try:
            self._ws.send(packb(obs))
        except ConnectionClosed as error:
            raise self._closed(error) from error
        return self._receive()

    def _receive(self) -> Any:
        try:
            reply = self._ws.recv(timeout=self.request_timeout_s)
        except ConnectionClosed as error:
            raise self._closed(error) from error
        except TimeoutError as error:
            self._lose()  # a late reply would answer the next request: start over on a new connection
            raise ServerError(f"no reply from {self.uri} within {self.request_timeout_s} s") from error
        if isinstance(reply, str):  # openpi servers send errors as text frames
            raise ServerError(f"policy server: {reply}")
        return unpackb(reply)

    def _lose(self) -> None:
        """Drop the connection; the next `infer` opens a new one (after the backoff)."""
        if self._ws is not None:
            self._ws.close()
        self._ws, self._retry_at = None, time.monotonic()

    def _closed(self, error: ConnectionClosed) -> ServerError:
        frame = error.rcvd or error.sent
        reason = f"code {frame.code}: {frame.reason}" if frame else "no close frame"
        self._lose()
        return ServerError(f"connection to {self.uri} closed ({reason})")

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
        self._ws, self._retry_at = None, float("inf")  # closed on purpose: never reconnect

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
