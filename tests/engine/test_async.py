import time

import pytest
import torch

from embodrl.algos.ppo import PPO
from embodrl.config import make_run_dir
from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.engine.env_client import StagedEnv
from embodrl.engine.schedules import make_schedule
from embodrl.train.logger import read_metrics
from embodrl.train.rl_runner import OnPolicyRunner
from tests.engine.helpers import make_policy, pendulum

STEPS = 10


def _train(tmp_path, *overrides):
    cfg = pendulum(f"run_root={tmp_path}", "train.iterations=3", "train.save_every=3", *overrides)
    runner = OnPolicyRunner(cfg, make_run_dir(cfg))
    runner.learn()
    return read_metrics(runner.run_dir)


@pytest.mark.parametrize(
    "engine",
    [
        ("engine.schedule=async", "engine.max_staleness=0"),
        ("engine.placement=disaggregated",),  # a policy copy that receives the weights of every update
        # envs stepped on the rollout thread itself
        ("engine.schedule=async", "engine.max_staleness=0", "engine.transport=inline"),
    ],
)
def test_async_with_staleness_zero_reproduces_the_synchronous_run(tmp_path, engine):
    sync = _train(tmp_path / "sync")
    other = _train(tmp_path / "other", *engine)
    for a, b in zip(sync, other, strict=True):
        for key in ("train/policy_loss", "train/value_loss", "train/approx_kl", "rollout/return"):
            assert a[key] == b[key], key


def test_staleness_bound_holds_while_the_actor_trains():
    cfg = pendulum("engine.schedule=async", "engine.num_stages=2", "engine.max_staleness=1")
    env = StagedEnv(cfg.env, cfg.engine)
    policy = make_policy(cfg, env)
    schedule = make_schedule(cfg.engine, env, policy, RolloutBuffer(STEPS, env.num_envs), "cpu")
    schedule.push_weights(policy, 0)
    staleness = []
    try:
        for version in range(5):  # rollout b is consumed by the actor at version b
            versions = schedule.collect(lambda: torch.arange(4)).buffer.data["version"]  # [T, N]
            assert bool((versions[1:] >= versions[:-1]).all()), "versions only grow inside a rollout"
            staleness.append(int((version - versions).max()))
            time.sleep(0.2)  # "training": meanwhile the producer runs ahead with the old weights
            with torch.no_grad():
                policy.log_std.add_(0.01)
            schedule.push_weights(policy, version + 1)
    finally:
        schedule.close()
        env.close()
    assert max(staleness) <= 1, staleness
    assert max(staleness) == 1, f"the producer never ran ahead: {staleness}"


def test_stale_samples_use_the_proximal_policy_in_the_ratio():
    cfg = pendulum("engine.placement=disaggregated")
    env = StagedEnv(cfg.env, cfg.engine)
    policy = make_policy(cfg, env)
    schedule = make_schedule(cfg.engine, env, policy, RolloutBuffer(STEPS, env.num_envs), "cpu")
    try:
        schedule.push_weights(policy, 0)
        data = schedule.collect(lambda: torch.arange(4)).buffer
    finally:
        schedule.close()
        env.close()
    with torch.no_grad():  # one update happened since: the rollout is one version stale
        policy.log_std.add_(0.3)
        flat = data.data.reshape(-1)
        expected = policy.evaluate(flat["obs"], flat["replay"]).logprob.reshape(data.data["logprob"].shape)
    assert not torch.allclose(expected, data.data["logprob"])
    metrics = PPO(policy, cfg.algo).update(data, 1, torch.Generator().manual_seed(0))
    torch.testing.assert_close(data.data["prox_logprob"], expected)
    # the clipped ratio is taken against the proximal policy: 1 on the first minibatch
    assert metrics["ratio0_maxdev"] < 1e-5


def test_paused_holds_the_producer_at_its_next_decision():
    cfg = pendulum("engine.schedule=async", "engine.max_staleness=1")
    env = StagedEnv(cfg.env, cfg.engine)
    policy = make_policy(cfg, env)
    schedule = make_schedule(cfg.engine, env, policy, RolloutBuffer(STEPS, env.num_envs), "cpu")
    acting = schedule.inference.policy  # the producer's copy
    calls: list[int] = []
    act = acting.act
    acting.act = lambda obs, deterministic=False: calls.append(1) or act(obs, deterministic)
    schedule.push_weights(policy, 0)
    try:
        schedule.collect(lambda: torch.arange(4))
        schedule.push_weights(policy, 50)  # room for ~50 more rollouts: the producer keeps acting
        with schedule.paused():  # what an evaluation does
            before = len(calls)
            time.sleep(0.3)
            assert len(calls) == before, "the producer acted during the pause"
        deadline = time.monotonic() + 10
        while len(calls) == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(calls) > before, "the producer did not go on after the pause"
    finally:
        schedule.close()
        env.close()
