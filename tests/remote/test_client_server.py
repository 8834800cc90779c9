"""The actor's client against the learner's server, in one process: acknowledged batches, duplicates,
resending after a learner restart, versioned weights, API keys and one-line errors."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from websockets.sync.client import connect

from embodrl.cli import main
from embodrl.remote.actor import actor_seed
from embodrl.remote.client import LearnerClient, LearnerError
from embodrl.remote.config import ActorConnectionConfig, LearnerServerConfig
from embodrl.remote.intake import Intake
from embodrl.remote.learner_server import LearnerServer
from embodrl.remote.protocol import packb, unpackb
from embodrl.remote.transition_log import TransitionLog

SPEC = {  # what the server reads of a policy spec: the transitions' keys and shapes
    "family": "gaussian",
    "policy": {"chunk_size": 1, "action_dim": 2},
    "obs_shapes": {"state": [3]},
    "read_keys": ["state"],
}


def batch(count: int = 4, start: float = 0.0) -> dict:
    state = np.arange(count * 3, dtype=np.float32).reshape(count, 3) + start
    return {
        "obs": {"state": state},
        "action": np.zeros((count, 1, 2), np.float32),
        "reward": np.full(count, start, np.float32),
        "next_obs": {"state": state + 1},
        "terminated": np.zeros(count, bool),
    }


def learner(log_dir, port: int = 0, api_key: str | None = None) -> LearnerServer:
    """A started server whose intake replays `log_dir` (as a restarted learner does)."""
    log = TransitionLog(log_dir)
    last_seq: dict[str, int] = {}
    for record in log.records():
        message = unpackb(record)
        last_seq[message["actor"]] = message["seq"]
    intake = Intake(log, last_seq, max_pending=8)
    return LearnerServer(LearnerServerConfig(port=port, api_key=api_key), intake, SPEC, "run1").start()


def client(server: LearnerServer, **settings) -> LearnerClient:
    cfg = ActorConnectionConfig(
        learner=f"ws://127.0.0.1:{server.port}", wait_s=5, reconnect_s=0.05, pull_every_s=0.05, **settings
    )
    return LearnerClient(cfg)


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_batch_is_stored_before_its_ack_and_a_resent_one_is_a_duplicate(tmp_path):
    server = learner(tmp_path)
    try:
        with client(server) as actor:
            assert actor.policy_spec == SPEC
            assert actor.submit(batch(), env_steps=4) == 0
            assert actor.flush(5)
            assert (actor.stats.acked, actor.stats.acked_transitions, actor.stats.duplicates) == (1, 4, 0)
        (arrival,) = server.intake.take()
        np.testing.assert_array_equal(arrival.transitions["obs"]["state"], batch()["obs"]["state"])
        assert len(list(TransitionLog(tmp_path).records())) == 1  # durable before the ack
        frame = packb({"type": "batch", "actor": "actor-0", "seq": 1, "env_steps": 4, "transitions": batch()})
        with connect(f"ws://127.0.0.1:{server.port}") as ws:  # an actor resending after a lost ack
            ws.send(packb({"type": "hello", "actor": "actor-0"}))
            assert unpackb(ws.recv(timeout=5))["last_seq"] == 0
            acks = []
            for _ in range(2):
                ws.send(frame)
                acks.append(unpackb(ws.recv(timeout=5)))
        assert [ack["duplicate"] for ack in acks] == [False, True]
        assert len(server.intake.take()) == 1
    finally:
        server.stop()
        server.intake.close()


def test_unacknowledged_batches_are_resent_to_a_restarted_learner(tmp_path):
    first = learner(tmp_path)
    port = first.port
    actor = client(first)
    try:
        actor.submit(batch(start=0), env_steps=4)
        assert actor.flush(5)
        first.stop()  # the learner goes away: the actor goes on acting into its outbox
        first.intake.close()
        actor.submit(batch(start=1), env_steps=4)
        actor.submit(batch(start=2), env_steps=4)
        wait_for(lambda: not actor.connected)
        assert actor.unacked == 2
        second = learner(tmp_path, port)  # the same log: it holds seq 0
        try:
            assert actor.flush(5)
            rewards = [float(a.transitions["reward"][0]) for a in second.intake.take()]
            assert rewards == [1.0, 2.0] and actor.stats.reconnects >= 1
            seqs = [unpackb(record)["seq"] for record in TransitionLog(tmp_path).records()]
            assert seqs == [0, 1, 2]  # each batch stored once
        finally:
            second.stop()
            second.intake.close()
    finally:
        actor.close()


def test_the_actor_pulls_each_weights_version_once(tmp_path):
    server = learner(tmp_path)
    try:
        with client(server) as actor:
            time.sleep(0.2)
            assert actor.take_weights() is None  # version 0: no weights yet
            server.publish(3, {"layer.weight": np.arange(4, dtype=np.float32)})
            wait_for(lambda: actor._new_weights is not None)
            version, state = actor.take_weights()
            assert version == 3
            np.testing.assert_array_equal(state["layer.weight"], np.arange(4))
            time.sleep(0.2)  # several pulls later: nothing new
            assert actor.take_weights() is None
    finally:
        server.stop()
        server.intake.close()


def test_a_batch_the_learner_cannot_take_stops_the_actor_with_its_reason(tmp_path):
    server = learner(tmp_path)
    try:
        with client(server) as actor:
            wrong = batch()
            wrong["obs"]["state"] = np.zeros((4, 5), np.float32)
            actor.submit(wrong, env_steps=4)
            wait_for(lambda: actor.error is not None)
            with pytest.raises(LearnerError, match=r"state\] is shaped \[4, 5\], expected \[4, 3\]"):
                actor.submit(batch(), env_steps=4)
    finally:
        server.stop()
        server.intake.close()


def test_a_wrong_api_key_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    server = learner(tmp_path, api_key="right")
    try:
        with pytest.raises(LearnerError, match="HTTP 401.*API key"):
            client(server, api_key="wrong")
        client(server, api_key="right").close()
        monkeypatch.setenv("EMBODRL_API_KEY", "wrong")
        assert main(["actor", "sac_pendulum", "--learner", f"127.0.0.1:{server.port}", "--wait", "0"]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("embodrl actor: error:") and "HTTP 401" in error and "\n" not in error
    finally:
        server.stop()
        server.intake.close()


def test_no_learner_is_a_one_line_error(capsys):
    assert main(["actor", "--learner", "ws://127.0.0.1:9", "--wait", "0"]) == 2
    error = capsys.readouterr().err.strip()
    assert "cannot connect to ws://127.0.0.1:9" in error and "embodrl learner" in error and "\n" not in error


def test_the_robot_side_client_needs_no_torch_and_the_actor_no_learner():
    probe = (
        "import sys; import embodrl.remote.client; assert 'torch' not in sys.modules, 'torch'; "
        "import embodrl.remote.actor, embodrl.remote.robot_actor; "  # of the engine, its episode tracker only
        "bad = [m for m in sys.modules if m.startswith(('embodrl.train', 'embodrl.algos', "
        "'embodrl.remote.learner', 'embodrl.engine.'))]; "
        "assert bad == ['embodrl.engine.episode_tracker'], bad"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


@pytest.mark.parametrize("command", ["learner", "actor"])
def test_the_commands_have_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "acknowledg" in text and "EMBODRL_API_KEY" in text and "%%" not in text
    if command == "actor":  # the robot mode: the deploy loop's safety layer and its box, teleop, resets
        assert all(word in text for word in ("--robot", "workspace_box", "teleop", "reset.mode"))


def test_actors_of_one_experiment_explore_differently():
    assert actor_seed(0, "actor-0") != actor_seed(0, "actor-1")
    assert actor_seed(0, "actor-0") == actor_seed(0, "actor-0") < 2**31


@pytest.mark.parametrize("drop_when_full", [False, True])
def test_a_full_outbox_while_the_learner_is_away(drop_when_full, tmp_path):
    server = learner(tmp_path)
    actor = client(server, max_unacked_batches=1, drop_when_full=drop_when_full)
    try:
        server.stop()
        server.intake.close()
        wait_for(lambda: not actor.connected)
        assert actor.submit(batch(), env_steps=4) == 0
        if drop_when_full:  # a robot goes on: the oldest unacknowledged batch makes room
            assert actor.submit(batch(), env_steps=4) == 1 and actor.stats.dropped == 1
        else:  # a simulator waits for room; one that is stopping queues nothing
            assert actor.submit(batch(), env_steps=4, wait=False) is None and actor.unacked == 1
            raised = []

            def submit() -> None:
                try:
                    actor.submit(batch(), env_steps=4)
                except LearnerError as error:
                    raised.append(error)

            waiting = threading.Thread(target=submit, daemon=True)
            waiting.start()
            waiting.join(0.3)
            assert waiting.is_alive() and actor.unacked == 1
            actor.close()
            waiting.join(2)  # closing ends the wait
            assert not waiting.is_alive() and "is closed" in str(raised[0])
    finally:
        actor.close()


@pytest.mark.parametrize(
    "argv",
    [
        ["learner", "--max-pending", "0"],
        ["learner", "--port", "70000"],
        ["actor", "--wait", "-1"],
        ["actor", "--batch-steps", "0"],
        ["actor", "--transitions", "-3"],
    ],
)
def test_a_bad_flag_is_a_one_line_error_naming_it(argv, capsys):
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert f"error: {argv[1]}=" in error and "\n" not in error
