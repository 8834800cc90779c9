"""Robot-side client of `embodrl serve` (or any openpi policy server): needs only numpy, msgpack, websockets.

with PolicyClient("ws://gpu-box:8000", api_key=...) as policy:
    chunk = policy.infer({"observation/image": rgb, "observation/state": q, "prompt": "..."})["actions"]
"""

from __future__ import annotations

import time
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from embodrl.deploy.protocol import packb, unpackb
from embodrl.errors import UserError


class ServerError(UserError):
    """The server refused a request (its reason is the message), dropped the connection or cannot be
    reached; uncaught, a one-line error."""


class PolicyClient:
    """A connection to a policy server: `metadata` from the handshake, then `infer(obs)` per request."""

    def __init__(
        self,
        uri: str,
        api_key: str | None = None,
        wait_s: float = 0.0,
        request_timeout_s: float = 30.0,
        max_message_bytes: int | None = 64 * 2**20,
    ) -> None:
        self.uri = uri if uri.startswith(("ws://", "wss://")) else f"ws://{uri}"
        self.request_timeout_s = request_timeout_s
        headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
        deadline = time.monotonic() + wait_s
        while True:  # like openpi's client: keep knocking while the server starts (up to wait_s)
            try:
                connection = connect(
                    self.uri, compression=None, max_size=max_message_bytes, additional_headers=headers
                )
                self._ws: ClientConnection = connection.__enter__()  # the documented context-manager use
                break
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
        self.metadata: dict = self._receive()

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        """Send one observation map; returns {"actions": [H, A], "server_timing", "policy_timing"}."""
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
            self._ws.close()  # a late reply would answer the next request: start over on a new client
            raise ServerError(f"no reply from {self.uri} within {self.request_timeout_s} s") from error
        if isinstance(reply, str):  # openpi servers send errors as text frames
            raise ServerError(f"policy server: {reply}")
        return unpackb(reply)

    def _closed(self, error: ConnectionClosed) -> ServerError:
        frame = error.rcvd or error.sent
        reason = f"code {frame.code}: {frame.reason}" if frame else "no close frame"
        return ServerError(f"connection to {self.uri} closed ({reason})")

    def close(self) -> None:
        self._ws.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
