"""The tiny SAC-on-Pendulum settings of the learner tests (over configs/experiment/sac_pendulum.yaml)."""

from __future__ import annotations

TINY = [
    "env.max_episode_steps=10",  # an iteration: 10 updates
    "train.eval_every=0",
    "train.tensorboard=false",
    "train.keep_best=false",
    "algo.batch_size=8",
    "algo.utd=1",
    "algo.num_critics=2",
    "algo.critic_hidden_dims=[16,16]",
    "policy.gaussian.hidden_dims=[16]",
]
