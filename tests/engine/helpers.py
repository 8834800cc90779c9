"""Shared pieces of the engine tests: the pendulum config (tests/pendulum.py), a small Gaussian policy, a
deterministic wrapper, one collected rollout, a pipelined rollout over a chosen transport."""

from __future__ import annotations

import torch

from embodrl.config import ExperimentConfig
from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.engine.env_client import StagedEnv
from embodrl.engine.schedules import make_schedule
from embodrl.policies.base import ActOut
from embodrl.policies.gaussian.modeling import GaussianPolicy
from embodrl.train.policy_setup import build_policy
from tests.pendulum import pendulum

__all__ = ["DeterministicGaussian", "collect_once", "make_policy", "pendulum", "pipelined_rollout"]


class DeterministicGaussian(GaussianPolicy):
    """Acts with the mean, so trajectories depend on nothing but the weights and the initial states."""

    def act(self, obs, deterministic: bool = False) -> ActOut:
        return super().act(obs, deterministic=True)


def make_policy(cfg: ExperimentConfig, env: StagedEnv, deterministic: bool = False) -> GaussianPolicy:
    torch.manual_seed(0)
    policy = build_policy(cfg, env)
    if deterministic:
        policy.__class__ = DeterministicGaussian
    return policy


def pipelined_rollout(env: StagedEnv, cfg: ExperimentConfig):
    """(schedule, rollout data) of a deterministic policy collected once from states 0..3 on `env`."""
    policy = make_policy(cfg, env, deterministic=True)
    schedule = make_schedule(cfg.engine, env, policy, RolloutBuffer(12, 4), "cpu")
    schedule.push_weights(policy, 0)
    return schedule, schedule.collect(lambda: torch.arange(4)).buffer.data.clone()


def collect_once(cfg: ExperimentConfig, steps: int, states) -> tuple[GaussianPolicy, RolloutBuffer]:
    """(policy, filled buffer) of one rollout of `steps` decisions from `states()` with cfg's engine; the
    env is closed again."""
    env = StagedEnv(cfg.env, cfg.engine)
    try:
        policy = make_policy(cfg, env)
        schedule = make_schedule(cfg.engine, env, policy, RolloutBuffer(steps, env.num_envs), "cpu")
        schedule.push_weights(policy, 0)
        return policy, schedule.collect(states).buffer
    finally:
        env.close()
