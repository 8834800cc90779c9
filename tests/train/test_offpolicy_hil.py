"""SAC on image `pick` the HIL-SERL way: cameras as cached frozen features, a learned reward, simulated
interventions whose steps join the demo buffer; the run resumes exactly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from embodrl.config import compose
from embodrl.errors import UserError
from embodrl.train import learned_reward_env
from embodrl.train.checkpointing import LAST, load_trainer_state
from embodrl.train.logger import read_metrics
from embodrl.train.offpolicy_runner import OffPolicyRunner

TINY = [
    "env.num_envs=2",
    "env.num_threads=1",
    "env.max_episode_steps=3",
    "policy.vision.blocks=2",
    "policy.gaussian.hidden_dims=[16]",
    "algo.demo_dataset=null",
    "algo.learning_starts=0",
    "algo.batch_size=8",
    "algo.utd=1",
    "algo.num_critics=2",
    "algo.critic_hidden_dims=[16]",
    "algo.critic_image_dim=8",
    "algo.buffer_size=100",
    "reward.model=fake",
    "reward.terminate_on_success=false",
    "intervention.threshold=0.05",
    "intervention.patience=1",
    "intervention.steps=2",
    "train.eval_every=0",
    "train.eval_episodes=1",
    "train.save_every=1",
    "train.tensorboard=false",
]


class AlwaysSuccess:
    """A stand-in classifier that calls every observation a success."""

    spec = SimpleNamespace(obs_keys=("state",), shapes={"state": (17,)}, threshold=0.5)

    def probability(self, obs):
        return torch.full((obs.batch_size[0],), 0.9)


@pytest.fixture(autouse=True)
def fake_classifier(monkeypatch):
    monkeypatch.setattr(learned_reward_env, "load_classifier", lambda path, device: AlwaysSuccess())


def tiny(iterations: int, *extra: str):
    return compose("pick_image_sac", [*TINY, f"train.iterations={iterations}", *extra])


def comparable(run_dir) -> list[dict]:
    return [
        {k: v for k, v in row.items() if not k.startswith("time/") and k != "rollout/env_steps_per_s"}
        for row in read_metrics(run_dir)
    ]


def test_classifier_reward_cached_features_interventions_and_an_exact_resume(tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    whole.mkdir(), split.mkdir()
    runner = OffPolicyRunner(tiny(2), whole)
    runner.learn()
    rows = comparable(whole)
    buffer = runner.buffer.data[: len(runner.buffer)]
    # the classifier's reward, never the simulator's (random actions do not pick the cube in 3 steps)
    assert buffer["reward"].eq(1.0).all() and rows[0]["reward/false_positive"] == 1.0
    channels, stride = runner.policy.cfg.vision.geometry()
    assert buffer["obs", "rgb"].shape == (12, channels, 64 // stride, 64 // stride)  # features, not pixels
    driven = sum(row["rollout/intervention_rate"] for row in rows) * 6  # 6 decisions per iteration
    assert 0 < driven and len(runner.demos) == round(driven)  # the takeovers, and only they, are demos
    assert rows[-1]["replay/demo_size"] == len(runner.demos)

    OffPolicyRunner(tiny(1), split).learn()
    OffPolicyRunner(tiny(2), split, resume=True).learn()
    assert comparable(split) == rows
    assert load_trainer_state(split / LAST)["demos"]["size"] == len(runner.demos)


class EnvZeroSucceeds:
    """A stand-in classifier that calls env 0's observations a success, the others' never."""

    spec = AlwaysSuccess.spec

    def probability(self, obs):
        return torch.tensor([0.9] + [0.1] * (obs.batch_size[0] - 1))


def test_frozen_features_are_computed_again_only_for_the_envs_that_restart(tmp_path, monkeypatch):
    monkeypatch.setattr(learned_reward_env, "load_classifier", lambda path, device: EnvZeroSucceeds())
    runner = OffPolicyRunner(tiny(1, "reward.terminate_on_success=true"), tmp_path)
    rows, stored_obs = [], runner.algo.stored_obs
    monkeypatch.setattr(runner.algo, "stored_obs", lambda obs: rows.append(len(obs)) or stored_obs(obs))
    runner._iterate()
    # the reset, then per decision both envs' next observations and env 0's restart; at the time limit both
    assert rows == [2, 2, 1, 2, 1, 2, 2]
    data = runner.buffer.data[: len(runner.buffer)]  # rows 2t (env 0) and 2t + 1 (env 1) per decision t
    for key in ("rgb", "state"):
        obs, following = data["obs", key], data["next_obs", key]
        assert torch.equal(obs[3::2], following[1:-2:2])  # env 1 goes on from where it was
        assert not torch.equal(obs[2::2], following[0:-2:2])  # env 0 starts over each decision


def test_interventions_refused_where_they_cannot_apply(tmp_path):
    with pytest.raises(UserError, match="chunk_size=1") as error:
        OffPolicyRunner(tiny(1, "policy.chunk_size=2"), tmp_path)
    assert "\n" not in str(error.value)
