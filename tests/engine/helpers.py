"""Shared pieces of the engine tests: a pendulum config, a small Gaussian policy, a deterministic wrapper."""

from __future__ import annotations

import torch

from embodrl.config import ExperimentConfig, compose
from embodrl.engine.env_client import StagedEnv
from embodrl.policies.base import ActOut
from embodrl.policies.gaussian.modeling import GaussianPolicy
from embodrl.train.rl_runner import build_policy

PENDULUM = [
    "env.suite=gym",
    "env.gym_id=InvertedPendulum-v5",
    "env.num_envs=4",
    "env.max_episode_steps=20",
    "policy.family=gaussian",
    "policy.chunk_size=1",
    "policy.action_dim=1",
    "policy.gaussian.hidden_dims=[16]",
    "policy.value_hidden_dims=[16]",
    "algo.minibatch_size=32",
    "algo.critic_warmup_iters=0",
    "train.eval_every=0",
    "train.eval_episodes=2",
    "train.tensorboard=false",
]


def pendulum(*overrides: str) -> ExperimentConfig:
    return compose(None, [*PENDULUM, *overrides])


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
