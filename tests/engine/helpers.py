"""Shared pieces of the engine tests: the pendulum config (tests/pendulum.py), a small Gaussian policy, a
deterministic wrapper."""

from __future__ import annotations

import torch

from embodrl.config import ExperimentConfig
from embodrl.engine.env_client import StagedEnv
from embodrl.policies.base import ActOut
from embodrl.policies.gaussian.modeling import GaussianPolicy
from embodrl.train.rl_runner import build_policy
from tests.pendulum import pendulum

__all__ = ["DeterministicGaussian", "make_policy", "pendulum"]


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
