"""Start an env worker on a thread, a process, a Ray actor or inline, and know whether it is still alive."""

from __future__ import annotations

import signal
import threading

from embodrl.engine.channel import Channel, DirectChannel, Header
from embodrl.engine.config import EngineConfig
from embodrl.engine.env_worker import build_env_worker, serve_env_worker
from embodrl.engine.worker_handle import WorkerHandle
from embodrl.sims.config import EnvConfig


class ThreadHandle(WorkerHandle):
    def __init__(self, *args) -> None:
        self.thread = threading.Thread(target=serve_env_worker, args=args, daemon=True, name="env-worker")
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def describe_exit(self) -> str:
        return "the env worker thread ended"

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)


class InlineHandle(WorkerHandle):
    """An env worker that answers each request inside the caller's `put` (no thread to hop to). A
    hung env hangs the caller: there is no one to notice a stall."""

    def __init__(
        self, env_cfg: EnvConfig, num_stages: int, device: str, requests: DirectChannel, replies: Channel
    ) -> None:
        self.worker = build_env_worker(env_cfg, num_stages, device, replies)  # None: `error` is queued
        self.replies, self.open = replies, self.worker is not None
        requests.server = self._answer

    def _answer(self, header: Header, payload) -> None:
        if self.open:
            self.open = self.worker.serve_one(header, payload, self.replies)

    def alive(self) -> bool:
        return self.open

    def describe_exit(self) -> str:
        return "the inline env worker was closed"

    def join(self, timeout: float) -> None:
        pass  # nothing runs on its own


def serve_env_worker_process(*args) -> None:
    """`serve_env_worker` in a child process, which leaves Ctrl-C to the trainer: a terminal's Ctrl-C
    reaches the whole process group, and the trainer finishes its iteration (which needs this worker)
    before it stops and closes its workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve_env_worker(*args)


class ProcessHandle(WorkerHandle):
    def __init__(self, *args) -> None:
        import torch.multiprocessing as mp

        # spawn, not fork: a forked child inherits the parent's threads' locks (torch, OpenMP, EGL)
        self.process = mp.get_context("spawn").Process(
            target=serve_env_worker_process, args=args, daemon=True, name="env-worker"
        )
        self.process.start()

    def alive(self) -> bool:
        return self.process.is_alive()

    def describe_exit(self) -> str:
        return f"the env worker process {self.process.pid} exited with code {self.process.exitcode}"

    def join(self, timeout: float) -> None:
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def launch_env_worker(
    env_cfg: EnvConfig, engine: EngineConfig, device: str, requests: Channel, replies: Channel
) -> WorkerHandle:
    """Start an env worker serving `requests` with the engine's transport."""
    args = (env_cfg, engine.num_stages, device, requests, replies)
    if engine.transport == "inproc":
        return ThreadHandle(*args)
    if engine.transport == "inline":
        return InlineHandle(*args)
    if engine.transport == "multiprocess":
        return ProcessHandle(*args)
    from embodrl.engine.ray_backend import RayHandle

    return RayHandle(engine.ray, *args)
