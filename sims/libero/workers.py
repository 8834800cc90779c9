"""Groups of LIBERO envs, in this process or in a worker process, behind one submit/result API.

A call is split in two so the VecEnv can start every group before waiting for any: worker
processes then simulate in parallel (LIBERO runs a few steps/s per env on one core). Messages are
numpy and plain Python only (pickled over a multiprocessing pipe between our own processes).
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

from embodrl.sims.libero.task_env import LiberoTaskEnv, TaskEnvSpec


def _run(envs: list[LiberoTaskEnv], method: str, args: list) -> list:
    """Call `method` on each env with its own argument tuple; an env given None is skipped."""
    return [None if a is None else getattr(env, method)(*a) for env, a in zip(envs, args, strict=True)]


class LocalGroup:
    """Envs stepped in this process."""

    def __init__(self, specs: list[TaskEnvSpec]):
        self.envs = [LiberoTaskEnv(s) for s in specs]
        self._result: list = []

    def submit(self, method: str, args: list) -> None:
        self._result = _run(self.envs, method, args)

    def result(self) -> list:
        return self._result

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _serve(conn, specs: list[TaskEnvSpec]) -> None:
    """Worker process loop: build the envs, then answer (method, args) messages until "close"."""
    try:
        envs = [LiberoTaskEnv(s) for s in specs]
        conn.send(("ok", None))
    except Exception as exc:  # report build errors (missing assets, GL) to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        method, args = conn.recv()
        if method == "close":
            _run(envs, "close", [()] * len(envs))
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", _run(envs, method, args)))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class ProcessGroup:
    """Envs stepped in a worker process (spawned: no forked GL or torch state)."""

    def __init__(self, specs: list[TaskEnvSpec]):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, specs), daemon=True)
        self._proc.start()
        child.close()
        self._pending = True  # the build acknowledgement

    def submit(self, method: str, args: list) -> None:
        if self._pending:
            self.result()
        self._conn.send((method, args))
        self._pending = True

    def result(self) -> Any:
        status, value = self._conn.recv()
        self._pending = False
        if status == "error":
            raise RuntimeError(f"LIBERO worker process failed: {value}")
        return value

    def close(self) -> None:
        try:
            if self._pending:
                self.result()
            self._conn.send(("close", None))
            self._conn.recv()
        except (EOFError, OSError, RuntimeError):
            pass  # the worker has already exited (after reporting its error)
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.terminate()
