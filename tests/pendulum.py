"""The tiny InvertedPendulum PPO experiment shared by the runner, engine and fine-tuning tests."""

from __future__ import annotations

from embodrl.config import ExperimentConfig, compose

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
    """The pendulum experiment with `overrides` (key=value, later ones win) applied on top."""
    return compose(None, [*PENDULUM, *overrides])
