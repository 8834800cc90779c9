"""Channels: one put/get interface for TensorDict messages with typed headers, over four transports.

The schedule code is the same whichever transport carries the messages:
- `inline`: no second thread: the env worker answers each request inside `put` (requests go through
  a `DirectChannel`, replies through an in-process queue);
- `inproc`: a thread-safe queue between threads of one process (tensors are passed by reference);
- `multiprocess`: a torch.multiprocessing queue; CPU payloads are copied into shared-memory slots that
  are reused from message to message, so only a slot number crosses the pipe;
- `ray`: a Ray queue actor, so workers may live on other machines (`ray` extra, imported lazily).
"""

from __future__ import annotations

import queue
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
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

    # seconds this end spent moving payloads (copies to and from shared memory, serialization), not
    # waiting; read and reset by pop_transfer_s. Zero for channels that hand over references.
    transfer_s: float = 0.0

    @abstractmethod
    def put(self, header: Header, payload: TensorDict | None = None) -> None: ...

    @abstractmethod
    def get(self, timeout: float | None = None) -> Message:
        """The next message; raises ChannelTimeout after `timeout` seconds (None waits forever)."""

    def pop_transfer_s(self) -> float:
        """transfer_s since the last call."""
        seconds, self.transfer_s = self.transfer_s, 0.0
        return seconds


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


class LocalChannel(Channel):
    """The inline worker's replies: put and read by one thread, so a deque without the locks of a queue.
    Every request is answered inside its put, so a read never waits."""

    def __init__(self) -> None:
        self._messages: deque[Message] = deque()

    def put(self, header: Header, payload: TensorDict | None = None) -> None:
        self._messages.append((header, payload))

    def get(self, timeout: float | None = None) -> Message:
        if not self._messages:
            raise ChannelTimeout("no reply: the inline env worker has answered every request")
        return self._messages.popleft()


class InProcChannel(QueueChannel):
    """Between threads of one process."""

    def __init__(self) -> None:
        super().__init__(queue.Queue())


@dataclass(frozen=True)
class _SlotRef:
    """A shared-memory slot of the sender's; `slot` is set the first time, when the receiver meets it."""

    layout: int
    index: int
    slot: TensorDict | None = None


def _layout(payload: TensorDict) -> tuple | None:
    """What a slot must match (keys, shapes, dtypes, nesting), or None when a payload cannot use slots
    (tensors off the CPU travel as they are: torch shares CUDA memory by handle)."""
    entries: list[tuple] = []
    for key, value in payload.items(include_nested=True):
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                return None
            entries.append((key, value.dtype, tuple(value.shape)))
        elif isinstance(value, TensorDict):
            entries.append((key, tuple(value.batch_size)))
        else:
            return None
    return tuple(payload.batch_size), tuple(entries)


class MultiprocessChannel(Channel):
    """Between processes of one machine, over a torch.multiprocessing queue.

    Sending a tensor through the queue creates a shared-memory file for it, about a millisecond per
    message of a dozen tensors. Instead the sender keeps slots: shared-memory copies of the payloads it
    has sent, one set per layout. A payload is copied into a slot the receiver has released, and only
    the slot's number is sent (the slot itself travels once, as shared-memory handles, the first time).
    The receiver copies the slot out and hands its number back on a second queue, so a slot is never
    written while it is read; a sender that finds no released slot adds one.
    """

    def __init__(self) -> None:
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        self._queue, self._released = context.Queue(), context.SimpleQueue()
        self._init_ends()

    def _init_ends(self) -> None:
        """Each process's own half: the sender's slots, the receiver's view of them."""
        self._layouts: dict[tuple, int] = {}  # sender: layout -> its number
        self._slots: dict[int, list[TensorDict]] = {}  # sender: the slots of each layout
        self._free: set[tuple[int, int]] = set()  # sender: (layout, index) released by the receiver
        self._seen: dict[tuple[int, int], TensorDict] = {}  # receiver: the slots met so far

    def __getstate__(self) -> dict:
        return {"_queue": self._queue, "_released": self._released}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_ends()

    def put(self, header: Header, payload: TensorDict | None = None) -> None:
        start = time.perf_counter()
        try:
            self._put(header, payload)
        finally:
            self.transfer_s += time.perf_counter() - start  # the queue pickles on its own feeder thread

    def _put(self, header: Header, payload: TensorDict | None) -> None:
        layout = None if payload is None else _layout(payload)
        if layout is None:
            self._queue.put((header, payload))
            return
        while not self._released.empty():
            self._free.add(self._released.get())
        number = self._layouts.setdefault(layout, len(self._layouts))
        slots = self._slots.setdefault(number, [])
        index = next((i for i in range(len(slots)) if (number, i) in self._free), None)
        if index is None:
            slots.append(payload.clone().share_memory_())
            index = len(slots) - 1
            self._queue.put((header, _SlotRef(number, index, slots[index])))
            return
        self._free.discard((number, index))
        slots[index].update_(payload)
        self._queue.put((header, _SlotRef(number, index)))

    def get(self, timeout: float | None = None) -> Message:
        try:
            header, payload = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise ChannelTimeout(f"no message within {timeout} s") from None
        if not isinstance(payload, _SlotRef):
            # A CUDA tensor arrives as a view of the sender's memory, valid while the sender lives (torch's
            # Note [Sharing CUDA tensors]): an env worker that exits or is restarted would leave it
            # dangling. A copy makes it this process's own and frees the sender's block at once.
            return header, None if payload is None else payload.clone()
        start = time.perf_counter()
        key = (payload.layout, payload.index)
        if payload.slot is not None:
            self._seen[key] = payload.slot
        out = self._seen[key].clone()
        self._released.put(key)
        self.transfer_s += time.perf_counter() - start
        return header, out


class RayChannel(QueueChannel):
    """Between Ray actors, possibly on different machines (needs `pip install embodrl[ray]`)."""

    def __init__(self) -> None:
        from ray.util.queue import Empty, Queue

        super().__init__(Queue(actor_options={"num_cpus": 0}), Empty)  # a queue needs no core of its own

    def put(self, header: Header, payload: TensorDict | None = None) -> None:
        start = time.perf_counter()  # serialization and the call to the queue actor; a get's share
        super().put(header, payload)  # cannot be told apart from its waiting
        self.transfer_s += time.perf_counter() - start


CHANNELS: dict[str, type[Channel]] = {
    "inline": LocalChannel,  # the replies; requests use a DirectChannel (`make_request_channel`)
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
