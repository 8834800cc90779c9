"""reward.model: the env's reward and success replaced by a classifier's, episodes ended on its success,
disagreement with the simulator counted, bad checkpoints refused in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from embodrl.cli import main
from embodrl.config import compose
from embodrl.engine.config import EngineConfig
from embodrl.errors import ConfigError, UserError
from embodrl.rewards.config import RewardConfig
from embodrl.sims.config import EnvConfig
from embodrl.train.learned_reward_env import LearnedRewardEnv

ENV = EnvConfig(suite="tabletop-basic", task="reach", num_envs=3, num_threads=1, max_episode_steps=10)


class EnvZeroSucceeds:
    """A stand-in classifier: env 0's observation is always a success, the others' never."""

    spec = SimpleNamespace(obs_keys=("state",), shapes={"state": (17,)})

    def probability(self, obs):
        p = torch.zeros(obs.batch_size[0])
        p[0] = 0.9
        return p


def _env(terminate: bool, engine: EngineConfig | None = None) -> LearnedRewardEnv:
    return LearnedRewardEnv(ENV, engine or EngineConfig(), EnvZeroSucceeds(), 0.5, terminate)


def test_reward_and_success_come_from_the_classifier():
    with _env(terminate=False) as env:
        env.reset_to(torch.arange(3))
        res = env.step(torch.zeros(3, 2, 7))  # a chunk of two: the reward goes to the last action
        assert res.reward.tolist() == [[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
        assert res.success.tolist() == [True, False, False]
        assert not res.done.any()  # no ending on the prediction unless asked
        metrics = env.pop_metrics()
        # the arm did not move: the simulator saw no success, so env 0's prediction is a false positive
        assert metrics["reward/predicted_success"] == pytest.approx(1 / 3)
        assert metrics["reward/false_positive"] == pytest.approx(1 / 3)
        assert metrics["reward/simulator_success"] == 0.0 and metrics["reward/false_negative"] == 0.0
        assert env.pop_metrics()["reward/predicted_success"] == 0.0  # counts restart after each pop


def test_terminate_on_success_ends_and_restarts_the_episode():
    with _env(terminate=True) as env:
        obs = env.reset_to(torch.arange(3))
        for _ in range(2):
            res = env.step(torch.full((3, 1, 7), 0.5))
            assert res.terminated.tolist() == [True, False, False] and res.success[0]
            # env 0 starts over: its new observation is a first one, its final one where it stopped
            assert not torch.equal(res.obs["state"][0], res.final_obs["state"][0])
            assert torch.equal(res.obs["state"][1:], res.final_obs["state"][1:])
        assert not torch.equal(res.obs["state"][1], obs["state"][1])  # the others moved on


class SucceedsAtCall:
    """A stand-in classifier that calls every observation a success at its `call`-th use only."""

    spec = EnvZeroSucceeds.spec

    def __init__(self, call: int) -> None:
        self.call, self.calls = call, 0

    def probability(self, obs):
        self.calls += 1
        return torch.full((obs.batch_size[0],), 0.9 if self.calls == self.call else 0.1)


def test_a_success_at_the_time_limit_is_a_termination():
    # the classifier fires on the step where the time limit ends the episode: a reward of 1 that must not
    # bootstrap from the next episode's start
    limit = ENV.max_episode_steps
    with LearnedRewardEnv(ENV, EngineConfig(), SucceedsAtCall(limit), 0.5, True) as env:
        env.reset_to(torch.arange(3))
        for _ in range(limit):
            res = env.step(torch.zeros(3, 1, 7))
        assert res.truncated.all() and res.success.all()
        assert res.terminated.all()


def test_simulator_success_no_longer_ends_episodes():
    with _env(terminate=False) as env:
        assert env.env_cfg.terminate_on_success is False


def test_terminate_needs_the_sequential_schedule():
    engine = EngineConfig(schedule="pipelined", num_stages=3)
    with pytest.raises(UserError, match="engine.schedule=sequential"):
        _env(terminate=True, engine=engine)


def test_reward_config_checks():
    with pytest.raises(ConfigError, match="needs a learned reward"):
        RewardConfig(terminate_on_success=True)
    with pytest.raises(ConfigError, match=r"reward.threshold"):
        compose(None, ["reward.model=x", "reward.threshold=1.5"])


def test_train_with_a_missing_reward_model_is_a_one_line_error(tmp_path, capsys):
    code = main(["train", f"run_root={tmp_path}", f"reward.model={tmp_path / 'missing'}", "env.num_envs=2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "Traceback" not in "".join(err)
    assert err[-1].startswith("embodrl train: error:") and "is not a reward model" in err[-1]
