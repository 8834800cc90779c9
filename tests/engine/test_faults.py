import itertools
import os
import signal
import time

import pytest
import torch

from embodrl.config import make_run_dir
from embodrl.engine.env_client import EnvWorkerError, StagedEnv
from embodrl.sims import registry
from embodrl.train.logger import read_metrics
from embodrl.train.rl_runner import OnPolicyRunner
from tests.engine import flaky_env
from tests.engine.helpers import pendulum, pipelined_rollout


def _train(tmp_path, *overrides):
    cfg = pendulum(f"run_root={tmp_path}", "train.iterations=2", "train.save_every=2", *overrides)
    runner = OnPolicyRunner(cfg, make_run_dir(cfg))
    runner.learn()
    return read_metrics(runner.run_dir)


@pytest.mark.parametrize(
    "engine",
    [("engine.schedule=pipelined",), ("engine.transport=inline",)],  # a thread; the caller's own thread
)
def test_a_failing_env_worker_is_restarted_and_the_iteration_retried(tmp_path, monkeypatch, caplog, engine):
    monkeypatch.setitem(registry.SUITES, "flaky", "tests.engine.flaky_env:make_flaky")
    monkeypatch.setattr(flaky_env.FlakyVecEnv, "fail_at", 50)  # 2 stages x 20 steps: 2nd rollout
    monkeypatch.setattr(flaky_env.FlakyVecEnv, "steps", 0)
    stages = (*engine, "engine.num_stages=2")
    clean = _train(tmp_path / "clean", *stages)
    flaky = _train(tmp_path / "flaky", *stages, "env.suite=flaky")
    assert flaky_env.FlakyVecEnv.fail_at == -1, "the fault was never injected"
    assert "simulated physics blow-up" in caplog.text
    assert [r["engine/env_restarts"] for r in flaky] == [0.0, 1.0]
    for a, b in zip(clean, flaky, strict=True):  # the retry replays the same states and samples
        for key in ("train/policy_loss", "rollout/return", "rollout/env_steps"):
            assert a[key] == b[key], key


def test_multiprocess_transport_gives_the_inproc_rollout_and_survives_a_killed_worker():
    rollouts = {}
    for transport in ("inproc", "multiprocess"):
        cfg = pendulum("engine.schedule=pipelined", "engine.num_stages=2", f"engine.transport={transport}")
        env = StagedEnv(cfg.env, cfg.engine)
        try:
            schedule, rollouts[transport] = pipelined_rollout(env, cfg)
            if transport == "multiprocess":
                env.worker.process.kill()  # only the worker this test started
                with pytest.raises(EnvWorkerError, match="exited"):
                    schedule.collect(lambda: torch.arange(4))
                assert env.worker.alive(), "a fresh worker replaces the dead one"
                env.worker.join(timeout=0)  # kill it: waiting for its start would only cost time
        finally:
            env.close()
    a, b = rollouts["inproc"], rollouts["multiprocess"]
    assert torch.equal(a["obs", "state"], b["obs", "state"]) and torch.equal(a["reward"], b["reward"])


def test_a_multiprocess_env_worker_leaves_ctrl_c_to_the_trainer():
    """A terminal's Ctrl-C reaches every process of the group; the trainer finishes its iteration first."""
    cfg = pendulum("engine.transport=multiprocess")
    env = StagedEnv(cfg.env, cfg.engine)
    try:
        env.reset_to(torch.arange(4))
        os.kill(env.worker.process.pid, signal.SIGINT)
        time.sleep(1.0)
        assert env.worker.alive()
        assert env.step(torch.zeros(4, 1, 1)).reward.shape == (4, 1)
    finally:
        env.close()


def test_a_stalled_env_worker_is_reported_with_its_stage_and_replaced(monkeypatch):
    monkeypatch.setitem(registry.SUITES, "stalling", "tests.engine.flaky_env:make_stalling")
    monkeypatch.setattr(flaky_env.StallingVecEnv, "steps", 0)
    cfg = pendulum("env.suite=stalling", "engine.num_stages=2", "engine.env_timeout_s=0.5")
    env = StagedEnv(cfg.env, cfg.engine)
    try:
        env.reset_to(torch.arange(4))
        with pytest.raises(EnvWorkerError, match="stage 1: stalled"):  # stage 1 hangs
            env.step(torch.zeros(4, 1, 1))
        env.reset_to(torch.arange(4))  # the fresh worker answers
        assert env.step(torch.zeros(4, 1, 1)).reward.shape == (4, 1)
    finally:
        env.close()


def test_a_soft_failing_env_answers_placeholders_until_the_failure_is_taken(monkeypatch):
    monkeypatch.setitem(registry.SUITES, "flaky", "tests.engine.flaky_env:make_flaky")
    monkeypatch.setattr(flaky_env.FlakyVecEnv, "fail_at", 2)  # stage 0's 1st step, stage 1's is the 2nd
    monkeypatch.setattr(flaky_env.FlakyVecEnv, "steps", 0)
    cfg = pendulum("env.suite=flaky", "engine.num_stages=2")
    env = StagedEnv(cfg.env, cfg.engine)
    try:
        obs = env.reset_to(torch.arange(4))
        env.fail_soft = True  # as ranks in lockstep collect
        for _ in range(2):  # the failing step, then one after it: the env worker is not asked again
            res = env.step(torch.zeros(4, 3, 1))
            assert torch.equal(res.obs["state"][2:], obs["state"][2:]), "stage 1 stood still"
            assert res.reward.shape == (4, 3) and not res.reward[2:].any()
            assert not res.steps_executed[2:].any() and not res.done.any()
        failure = env.take_failure()
        assert isinstance(failure, EnvWorkerError) and failure.stage == 1
        assert env.take_failure() is None
        env.reset_to(torch.arange(4))  # the retry: stage 1 was rebuilt and steps again
        assert bool(env.step(torch.zeros(4, 1, 1)).steps_executed.all())
    finally:
        env.close()


def test_a_soft_failing_stage_answers_the_episode_flags_the_env_names(monkeypatch):
    """The placeholder of a failed stage holds the env's episode flags (unset), so it joins the other
    stages' results."""
    from embodrl.config import compose
    from embodrl.sims.tabletop.env import WRONG_OBJECT, TabletopEnv

    steps, step = itertools.count(1), TabletopEnv.step

    def failing_step(self, actions):
        if next(steps) == 2:  # stage 1's first step
            raise RuntimeError("simulated physics blow-up")
        return step(self, actions)

    monkeypatch.setattr(TabletopEnv, "step", failing_step)
    cfg = compose(None, ["env.suite=tabletop-lang", "env.num_envs=4", "engine.num_stages=2"])
    env = StagedEnv(cfg.env, cfg.engine)
    try:
        env.reset_to(torch.arange(4))
        env.fail_soft = True
        res = env.step(torch.zeros(4, 1, 7))
        assert env.episode_flag_names == (WRONG_OBJECT,) and list(res.episode_flags.keys()) == [WRONG_OBJECT]
        assert not res.episode_flags[WRONG_OBJECT].any() and not res.steps_executed[2:].any()
        assert env.take_failure().stage == 1
    finally:
        env.close()
