"""The off-policy runner on Pendulum-v1: the run folder, exact resume with the replay buffer, demos."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from embodrl.config import compose
from embodrl.data.lerobot_dataset import LeRobotDatasetWriter
from embodrl.errors import ConfigError, UserError
from embodrl.policies.loading import load_policy
from embodrl.train.checkpointing import LAST, POLICY_DIR, load_trainer_state
from embodrl.train.logger import read_metrics
from embodrl.train.offpolicy_runner import OffPolicyRunner
from embodrl.train.sft_then_rl import train

TINY = [
    "env.max_episode_steps=10",
    "train.eval_every=2",
    "train.eval_episodes=1",
    "train.save_every=1",
    "train.tensorboard=false",
    "algo.learning_starts=10",
    "algo.batch_size=8",
    "algo.utd=2",
    "algo.num_critics=3",
    "algo.critic_hidden_dims=[16,16]",
    "policy.gaussian.hidden_dims=[16]",
]


def tiny(iterations: int, *extra: str):
    return compose("sac_pendulum", [*TINY, f"train.iterations={iterations}", *extra])


def comparable(run_dir) -> list[dict]:
    """metrics.jsonl without what the clock decides."""
    return [
        {k: v for k, v in row.items() if not k.startswith("time/") and k != "rollout/env_steps_per_s"}
        for row in read_metrics(run_dir)
    ]


def test_resumed_run_logs_what_the_uninterrupted_one_does(tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    whole.mkdir(), split.mkdir()
    summary = train(tiny(4), whole)  # `embodrl train` picks the off-policy runner for algo=sac
    assert "eval/return" in summary and (whole / "final_eval.json").is_file()
    OffPolicyRunner(tiny(2), split).learn()
    OffPolicyRunner(tiny(4), split, resume=True).learn()
    rows = comparable(whole)
    assert len(rows) == 4 and "train/critic_loss" in rows[-1] and "eval/return" in rows[1]
    assert comparable(split) == rows
    state = load_trainer_state(whole / LAST)
    assert state["replay"]["size"] == 40 and state["replay"]["data"]["obs"]["state"].shape == (40, 3)
    for a, b in zip(
        load_policy(whole / LAST / POLICY_DIR).state_dict().values(),
        load_policy(split / LAST / POLICY_DIR).state_dict().values(),
        strict=True,
    ):
        assert torch.equal(a, b)


def test_the_saved_policy_acts_as_the_trained_one(tmp_path):
    runner = OffPolicyRunner(tiny(1, "train.eval_every=0", "train.keep_best=false"), tmp_path)
    runner.learn()
    saved = load_policy(tmp_path / LAST / POLICY_DIR)
    obs = runner.env.reset_to(torch.tensor([3]))
    torch.testing.assert_close(
        saved.act(obs, deterministic=True).actions, runner.policy.act(obs, deterministic=True).actions
    )
    assert "eval/return" in json.loads((tmp_path / "final_eval.json").read_text())


def write_demos(root, episodes: int = 2, length: int = 5) -> None:
    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [1], "names": None},
    }
    rng = np.random.default_rng(0)
    with LeRobotDatasetWriter(root, 20, features) as writer:
        for _ in range(episodes):
            state, action = rng.normal(size=(length, 3)), rng.uniform(-1, 1, (length, 1))
            episode = {"observation.state": state, "action": action}
            writer.add_episode({k: v.astype(np.float32) for k, v in episode.items()}, "swing up")


def test_demos_fill_their_share_of_every_batch(tmp_path):
    write_demos(tmp_path / "demos")
    runner = OffPolicyRunner(tiny(1, f"algo.demo_dataset={tmp_path / 'demos'}"), tmp_path / "run")
    assert len(runner.demos) == 10
    runner._iterate()  # 10 online transitions, whose Pendulum rewards are negative
    batch = runner.sample()
    assert batch.batch_size[0] == 8 and int((batch["reward"] >= 0).sum()) == 4  # demos: 0, and 1 at the end
    with pytest.raises(ConfigError, match="chunk_size=1"):
        OffPolicyRunner(tiny(1, f"algo.demo_dataset={tmp_path / 'demos'}", "policy.chunk_size=2"), tmp_path)


# 5000 env steps (the first 600 random) at utd 1 with 2 critics: what the learning tests give SAC
SWING_UP = [
    "train.iterations=25",
    "algo.learning_starts=600",
    "algo.utd=1",
    "algo.num_critics=2",
    "train.eval_every=0",
    "train.tensorboard=false",
]


@pytest.mark.slow
def test_sac_learns_to_swing_the_pendulum_up(tmp_path):
    """5000 env steps (the first 600 random) of SAC at utd 1 with 2 critics: the deterministic return on 5
    fixed episodes ends far above what the random episodes scored (about -1200)."""
    final = OffPolicyRunner(compose("sac_pendulum", SWING_UP), tmp_path).learn()
    random = [row["rollout/return"] for row in read_metrics(tmp_path)[:3]]
    assert final["eval/return"] > sum(random) / 3 + 400


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_to_the_uninterrupted_metrics(tmp_path):
    """kill -9 at some point after the first checkpoint (possibly inside a save of the buffer): the resumed
    run still logs what the uninterrupted one does."""
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    killed.mkdir(), whole.mkdir()
    code = (
        "import sys; from pathlib import Path; from embodrl.config import compose; "
        "from embodrl.train.offpolicy_runner import OffPolicyRunner; "
        "OffPolicyRunner(compose('sac_pendulum', sys.argv[2:]), Path(sys.argv[1])).learn()"
    )
    overrides = [*TINY, "train.iterations=12"]
    child = subprocess.Popen([sys.executable, "-c", code, str(killed), *overrides])
    try:
        deadline = time.monotonic() + 120
        while not (killed / LAST).is_dir() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        time.sleep(1.0)  # into the next iterations and saves
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL, "the run ended before it was killed: nothing tested"
    OffPolicyRunner(tiny(12), killed, resume=True).learn()
    OffPolicyRunner(tiny(12), whole).learn()
    assert comparable(killed) == comparable(whole)


def test_a_learned_reward_that_is_no_model_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match="is not a reward model") as error:
        OffPolicyRunner(tiny(1, f"reward.model={tmp_path}"), tmp_path)
    assert "\n" not in str(error.value)
