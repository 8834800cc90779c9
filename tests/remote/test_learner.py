"""The learner in one process: updates wait for the actors' transitions, the checkpoint holds every stored
batch, and a resumed learner replays the log records the checkpoint lacks and publishes its weights."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from embodrl.config import compose
from embodrl.errors import UserError
from embodrl.remote.client import LearnerClient
from embodrl.remote.config import ActorConnectionConfig, LearnerServerConfig
from embodrl.remote.learner import LOG_DIR, Learner
from embodrl.remote.protocol import packb
from embodrl.remote.transition_log import TransitionLog
from embodrl.train.checkpointing import LAST, load_trainer_state
from embodrl.train.logger import read_metrics
from tests.remote.tiny import TINY


def pendulum_batch(count: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    state = rng.normal(size=(count, 3)).astype(np.float32)
    return {
        "obs": {"state": state},
        "action": rng.uniform(-2, 2, size=(count, 1, 1)).astype(np.float32),
        "reward": rng.normal(size=count).astype(np.float32),
        "next_obs": {"state": state + 0.1},
        "terminated": np.zeros(count, bool),
    }


def test_the_learner_trains_on_what_actors_send_and_resumes_from_its_log(tmp_path):
    # 2 iterations of 10 updates, each earned by a transition beyond the first 40: it needs all 60
    cfg = compose(
        "sac_pendulum", [*TINY, "train.iterations=2", "train.save_every=1", "algo.learning_starts=40"]
    )
    learner = Learner(cfg, tmp_path, LearnerServerConfig(port=0))
    learning = threading.Thread(target=learner.learn)
    learning.start()
    while learner.server.port is None:
        learning.join(0.05)
    conn = ActorConnectionConfig(learner=f"ws://127.0.0.1:{learner.server.port}", wait_s=10)
    with LearnerClient(conn) as client:
        assert client.policy_spec["read_keys"] == ["state"]
        client.submit(
            pendulum_batch(2, 0), env_steps=2, episodes={"episodes": 1, "return": -10.0, "success": 0.0}
        )
        client.submit(
            pendulum_batch(2, 1), env_steps=2, episodes={"episodes": 3, "return": -2.0, "success": 1.0}
        )
        for seed in range(2, 30):
            client.submit(pendulum_batch(2, seed), env_steps=2)
        assert client.flush(30)
        learning.join(60)
        assert not learning.is_alive()
        deadline = time.monotonic() + 5
        while not client.finished and time.monotonic() < deadline:  # told that the run is over
            time.sleep(0.02)
        assert client.finished and client.submit(pendulum_batch(2, 30), env_steps=2) is None
    state = load_trainer_state(tmp_path / LAST)
    assert state["iteration"] == 2 and state["remote"]["updates"] == 20
    assert state["replay"]["size"] == state["remote"]["received"] == 60
    assert state["remote"]["last_seq"] == {"actor-0": 29}
    first, second = read_metrics(tmp_path)
    assert (first["rollout/episodes"], first["rollout/return"], first["rollout/success"]) == (4, -4.0, 0.75)
    assert (
        "rollout/episodes" not in second and first["rollout/env_steps"] <= second["rollout/env_steps"] == 60
    )

    # acknowledged after that checkpoint (a kill came before the next one): only in the log
    log = TransitionLog(tmp_path / LOG_DIR, state["remote"]["first_segment"])
    for seq in (29, 30):  # 29 is in the checkpoint already
        batch = {
            "type": "batch",
            "actor": "actor-0",
            "seq": seq,
            "env_steps": 3,
            "transitions": pendulum_batch(3, seq),
        }
        log.append(packb(batch))
    log.close()
    resumed = Learner(cfg, tmp_path, LearnerServerConfig(port=0), resume=True)
    assert len(resumed.buffer) == resumed.remote.received == 63
    assert resumed.intake.last_seq("actor-0") == 30
    assert resumed.iteration == 2 and resumed.server._weights[0] == 2  # actors get the checkpoint's weights
    resumed.intake.close()
    resumed.env.close()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo=ppo"], "algo.name=ppo learns on-policy"),
        (["algo.noise_policy=DIR"], "not supported by"),
    ],
)
def test_what_the_learner_cannot_train_is_refused_in_one_line(overrides, message, tmp_path):
    cfg = compose("sac_pendulum", [*TINY, *overrides])
    with pytest.raises(UserError, match=message):
        Learner(cfg, tmp_path, LearnerServerConfig(port=0))
