"""Channels: one put/get interface for TensorDict messages with typed headers, over four transports.

The schedule code is the same whichever transport carries the messages:
- `inline`: no second thread: the env worker answers each request inside `put` (requests go through
  a `DirectChannel`, replies through an in-process queue);
- `inproc`: a thread-safe queue between threads of one process (tensors are passed by reference);
- `multiprocess`: a torch.multiprocessing queue; CPU tensors travel through shared memory;
- `ray`: a Ray queue actor, so workers may live on other machines (`ray` extra, imported lazily).
"""

from __future__ import annotations

import queue
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tensordict import TensorDict

from embodrl.choices import check_choice
from embodrl.engine.config import TRANSPORTS


@dataclass(frozen=True)
class Header:
    """What a message is: its kind, the pipeline stage it belongs to, the weight version and step index."""

    kind: str  # a request ("step", "reset_to", "render", "close") or a reply ("ok", "error", "spec")
    stage: int = 0
    version: int = 0  # weight version of the policy that produced the payload (actions)
    step: int = 0  # decision index inside the rollout
    info: Any = None  # small picklable extras: env specs, an error's traceback, worker-side timings


Message = tuple[Header, TensorDict | None]


class ChannelTimeout(TimeoutError):
    """Nothing arrived on a channel within the timeout."""


class Channel(ABC):
    """A FIFO of (Header, TensorDict | None) messages from one producer to one consumer."""

    @abstractmethod
    def put(self, header: Header, payload: TensorDict | None = None) -> None: ...

    @abstractmethod
    def get(self, timeout: float | None = None) -> Message:
        """The next message; raises ChannelTimeout after `timeout` seconds (None waits forever)."""


class QueueChannel(Channel):
    """A channel over a queue with the standard library's put/get(timeout) interface; `empty` is the
    exception its get raises on timeout."""

    def __init__(self, q, empty: type[Exception] = queue.Empty) -> None:
        self._queue, self._empty = q, empty

    def put(self, header: Header, payload: TensorDict | None = None) -> None:
        self._queue.put((header, payload))

    def get(self, timeout: float | None = None) -> Message:
        try:
            return self._queue.get(timeout=timeout)
        except self._empty:
            raise ChannelTimeout(f"no message within {timeout} s") from None


class DirectChannel(Channel):
    """Requests handed to a function in the caller's thread as they are put (the `inline` transport)."""

    def __init__(self) -> None:
        self.server: Callable[[Header, TensorDict | None], None] | None = None  # set by the worker

    def put(self, header: Header, payload: TensorDict | None = None) -> None:
        if self.server is None:
            raise RuntimeError("no env worker is attached to this inline channel")
        self.server(header, payload)

    def get(self, timeout: float | None = None) -> Message:
        raise RuntimeError("an inline request channel is answered on put; nothing waits to be read")


class InProcChannel(QueueChannel):
    """Between threads of one process."""

    def __init__(self) -> None:
        super().__init__(queue.Queue())


class MultiprocessChannel(QueueChannel):
    """Between processes of one machine; torch's queue moves CPU tensor storage into shared memory."""

    def __init__(self) -> None:
        import torch.multiprocessing as mp

        super().__init__(mp.get_context("spawn").Queue())


class RayChannel(QueueChannel):
    """Between Ray actors, possibly on different machines (needs `pip install embodrl[ray]`)."""

    def __init__(self) -> None:
        from ray.util.queue import Empty, Queue

        super().__init__(Queue(actor_options={"num_cpus": 0}), Empty)  # a queue needs no core of its own


CHANNELS: dict[str, type[Channel]] = {
    "inline": InProcChannel,  # the replies; requests use a DirectChannel (`make_request_channel`)
    "inproc": InProcChannel,
    "multiprocess": MultiprocessChannel,
    "ray": RayChannel,
}


def make_channel(transport: str) -> Channel:
    """A new channel of the named transport."""
    check_choice("engine.transport", transport, TRANSPORTS)
    return CHANNELS[transport]()


def make_request_channel(transport: str) -> Channel:
    """The channel requests travel on to an env worker: answered on put for `inline`, else a queue."""
    return DirectChannel() if transport == "inline" else make_channel(transport)
