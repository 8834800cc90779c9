import numpy as np
import pytest
import torch

from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.engine.env_client import StagedEnv
from embodrl.engine.schedules import make_schedule
from embodrl.sims.registry import make_env
from tests.engine.helpers import make_policy, pendulum

STEPS = 30  # longer than an episode (20), so auto-resets and truncation bootstraps happen inside


def _rollout(*overrides: str, deterministic: bool = True):
    cfg = pendulum(*overrides)
    env = StagedEnv(cfg.env, cfg.engine)
    try:
        policy = make_policy(cfg, env, deterministic)
        schedule = make_schedule(cfg.engine, env, policy, RolloutBuffer(STEPS, env.num_envs), "cpu")
        schedule.push_weights(policy, 0)
        rollout = schedule.collect(lambda: torch.arange(env.num_envs) + 100)
    finally:
        env.close()
    return rollout


def test_staged_env_matches_the_plain_env_step_for_step():
    cfg = pendulum("engine.num_stages=2")
    staged, plain = StagedEnv(cfg.env, cfg.engine), make_env(cfg.env)
    try:
        ids = torch.tensor([7, 3, 9, 1])
        assert torch.equal(staged.reset_to(ids)["state"], plain.reset_to(ids)["state"])
        gen = torch.Generator().manual_seed(0)
        for _ in range(25):
            actions = torch.rand(4, 1, 1, generator=gen) * 2 - 1
            a, b = staged.step(actions), plain.step(actions)
            for key in ("reward", "terminated", "truncated", "steps_executed"):
                assert torch.equal(getattr(a, key), getattr(b, key)), key
            assert torch.equal(a.obs["state"], b.obs["state"])
            assert torch.equal(a.final_obs["state"], b.final_obs["state"])
        # resetting envs of one stage leaves the other stage's observations alone
        obs = staged.reset_to(torch.tensor([5]), torch.tensor([3]))
        assert torch.equal(obs["state"][:3], a.obs["state"][:3])
        assert torch.equal(obs["state"][3], plain.reset_to(torch.tensor([5]), torch.tensor([3]))["state"][3])
    finally:
        staged.close()
        plain.close()


@pytest.mark.parametrize("stages", [2, 4])
def test_pipelined_gives_the_sequential_trajectories(stages):
    sequential_buffer = _rollout().buffer
    pipelined_buffer = _rollout("engine.schedule=pipelined", f"engine.num_stages={stages}").buffer
    # the pipeline resets and values its stages one by one; the window's bootstrap is the same
    torch.testing.assert_close(
        sequential_buffer.last_value, pipelined_buffer.last_value, rtol=1e-6, atol=1e-6
    )
    sequential, pipelined = sequential_buffer.data, pipelined_buffer.data
    assert bool((sequential["truncated"] | sequential["terminated"]).any()), "no episode ended in the rollout"
    for key in ("reward", "terminated", "truncated", "steps_executed", "version"):
        assert torch.equal(sequential[key], pipelined[key]), key
    for key in (("obs", "state"), "actions", "value", "bootstrap_value", "logprob"):
        torch.testing.assert_close(sequential[key], pipelined[key], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("stages", [1, 2])
def test_inline_transport_gives_the_threaded_rollout(stages):
    stages = f"engine.num_stages={stages}"
    threaded = _rollout(stages, deterministic=False).buffer.data
    inline = _rollout(stages, "engine.transport=inline", deterministic=False).buffer.data
    assert bool((inline["truncated"] | inline["terminated"]).any()), "no episode ended in the rollout"
    keys = ("reward", "terminated", "truncated", ("obs", "state"), "actions", "logprob", "bootstrap_value")
    for key in keys:
        assert torch.equal(threaded[key], inline[key]), key


def test_inline_transport_cannot_pipeline():
    from embodrl.errors import ConfigError

    with pytest.raises(ConfigError, match="engine.transport=inline simulates on the inferring thread"):
        pendulum("engine.schedule=pipelined", "engine.num_stages=2", "engine.transport=inline")


@pytest.mark.parametrize("transport", ["inproc", "multiprocess"])
def test_rollout_reports_stage_timings_and_episodes(transport):
    pipelined = ("engine.schedule=pipelined", "engine.num_stages=2")
    rollout = _rollout(*pipelined, f"engine.transport={transport}", deterministic=False)
    assert {"inference", "env_step", "env_wait"} <= set(rollout.timings)
    # transfer: the trainer's side of moving payloads, which threads do not do
    assert ("transfer" in rollout.timings) == (transport == "multiprocess")
    assert all(v >= 0 for v in rollout.timings.values())
    assert rollout.episodes["episodes"] >= 1
    assert rollout.buffer.full and torch.equal(rollout.buffer.data["version"], torch.zeros(STEPS, 4).long())


def test_num_envs_must_split_into_the_stages():
    from embodrl.errors import UserError

    cfg = pendulum("engine.schedule=pipelined", "engine.num_stages=3")
    with pytest.raises(UserError, match="multiple of engine.num_stages=3"):
        StagedEnv(cfg.env, cfg.engine)


@pytest.mark.parametrize("transport", ["inproc", "inline"])
def test_a_bad_env_config_is_the_users_error_not_a_worker_crash(transport):
    from embodrl.errors import UserError

    cfg = pendulum("env.gym_id=NoSuchEnv-v0", f"engine.transport={transport}")
    with pytest.raises(UserError):
        StagedEnv(cfg.env, cfg.engine)


@pytest.mark.parametrize("transport", ["inproc", "multiprocess"])
def test_an_env_reports_its_render_time_inside_env_step(transport):
    from embodrl.config import compose

    cfg = compose(
        None,
        ["env.suite=tabletop-basic", "env.obs_mode=rgb", "env.image_size=64", "env.num_envs=2"]
        + ["env.num_threads=1", f"engine.transport={transport}"],
    )
    env = StagedEnv(cfg.env, cfg.engine)
    try:
        env.reset_to(torch.arange(2))
        env.timer.pop()
        for _ in range(2):
            env.step(torch.zeros(2, 1, env.action_spec.dim))
        timings = env.timer.pop()
    finally:
        env.close()
    assert 0 < timings["render"] < timings["env_step"], timings


def test_an_envs_episode_flags_reach_the_buffer_and_the_rollouts_outcomes(monkeypatch):
    from embodrl.config import compose
    from embodrl.sims.tabletop.env import WRONG_OBJECT, TabletopEnv

    # env 0 moves a wrong object at every step, env 1 never
    monkeypatch.setattr(TabletopEnv, "_moved_watched", lambda self: np.arange(self.num_envs) == 0)
    # pick cannot succeed within 2 steps: every env plays three whole 2-step episodes in 6 decisions
    overrides = ["env.suite=tabletop-lang", "env.task=pick", "env.num_envs=2", "env.max_episode_steps=2"]
    cfg = compose(None, [*overrides, "policy.family=gaussian", "policy.chunk_size=1"])
    env = StagedEnv(cfg.env, cfg.engine)
    try:
        policy = make_policy(cfg, env)
        schedule = make_schedule(cfg.engine, env, policy, RolloutBuffer(6, 2), "cpu")
        schedule.push_weights(policy, 0)
        rollout = schedule.collect(lambda: torch.arange(2))
    finally:
        env.close()
    assert rollout.buffer.data["episode_flags", WRONG_OBJECT].tolist() == [[True, False]] * 6
    assert rollout.episodes["episodes"] == 6 and rollout.episodes[WRONG_OBJECT] == 0.5
