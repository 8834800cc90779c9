"""kill -9 of the learner, then of an actor, in a real run (Pendulum-v1, tiny networks): after each restart
learning goes on, and every batch the actor saw acknowledged is in the learner's replay buffer, once."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from embodrl.train.checkpointing import LAST, load_trainer_state
from tests.remote.tiny import TINY

BATCH_STEPS = 2  # decisions per batch; Pendulum's one env makes them 2 transitions
TINY = [
    *TINY,
    "train.iterations=100000",  # stopped by SIGTERM
    "train.save_every=3",
    "algo.learning_starts=20",
]
ACKED = re.compile(r"weights v(\d+); acked up to batch (-?\d+) .* (\d+) reconnects")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Process:
    """An `embodrl` subprocess whose output lines are collected as they come."""

    def __init__(self, *args: str, cwd: Path) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "embodrl.cli", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.append(line.rstrip())

    def wait_for(self, pattern: str, timeout_s: float = 60.0) -> re.Match:
        """The first match of `pattern` in a line printed from now on."""
        start, deadline = len(self.lines), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.lines[start:]:
                if match := re.search(pattern, line):
                    return match
            assert self.popen.poll() is None, "exited:\n" + "\n".join(self.lines[-20:])
            time.sleep(0.05)
        raise AssertionError(
            f"no line matching {pattern!r} within {timeout_s} s:\n" + "\n".join(self.lines[-20:])
        )

    def acked(self) -> tuple[int, int, int]:
        """(weights version, last acknowledged batch, reconnects) of the actor's latest status line."""
        for line in reversed(self.lines):
            if match := ACKED.search(line):
                return tuple(int(group) for group in match.groups())
        return (0, -1, 0)

    def kill(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)


def wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_killed_learner_and_actor_lose_no_acknowledged_transition(tmp_path):
    url = f"ws://127.0.0.1:{(port := free_port())}"
    overrides = ["sac_pendulum", *TINY, f"run_root={tmp_path / 'runs'}"]
    actor_args = [*overrides, "--learner", url, "--status-every", "0.05", "--batch-steps", str(BATCH_STEPS)]
    learner = Process("learner", *overrides, "--port", str(port), cwd=tmp_path)
    run_dir = Path(learner.wait_for(r"run folder: (.+)").group(1))
    actor = Process("actor", *actor_args, cwd=tmp_path)
    try:
        wait_until(lambda: (run_dir / LAST).is_dir() and actor.acked()[0] > 0)  # weights pulled, saved once
        learner.kill()
        acked_before_kill = actor.acked()[1]
        first_checkpoint = load_trainer_state(run_dir / LAST)["iteration"]

        learner = Process("learner", "--resume", str(run_dir), "--port", str(port), cwd=tmp_path)
        learner.wait_for(r"replayed \d+ transitions from the log")
        wait_until(lambda: actor.acked()[2] >= 1 and actor.acked()[1] > acked_before_kill + 5)
        actor.kill()
        acked_by_first_actor = actor.acked()[1]

        actor = Process("actor", *actor_args, cwd=tmp_path)  # the same id: it continues the numbering
        wait_until(lambda: actor.acked()[1] > acked_by_first_actor + 5)
        acked_by_second_actor = actor.acked()[1]
        learner.popen.send_signal(signal.SIGTERM)  # stops at the end of an iteration, saved
        assert learner.popen.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        for process in (learner, actor):
            if process.popen.poll() is None:
                process.kill()

    state = load_trainer_state(run_dir / LAST)
    stored = state["remote"]["last_seq"]["actor-0"]
    assert stored >= acked_by_second_actor > acked_by_first_actor > acked_before_kill
    # batches 0..stored each once: nothing acknowledged lost, no resent batch counted twice
    assert state["replay"]["size"] == state["remote"]["received"] == (stored + 1) * BATCH_STEPS
    assert state["iteration"] > first_checkpoint and state["remote"]["updates"] > 0
