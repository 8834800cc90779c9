"""The tiny settings of the learner tests: SAC on Pendulum (over configs/experiment/sac_pendulum.yaml), and
SAC on the tabletop's state (what a learner serves its robot actors); a learner serving in this process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from embodrl.config import compose
from embodrl.remote.config import ActorConnectionConfig, LearnerServerConfig
from embodrl.remote.learner import Learner

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

TABLETOP_SAC = [
    "env=tabletop_basic",
    "policy=gaussian_sac",
    "algo=sac",
    "env.task=reach",
    "env.num_envs=1",
    "policy.action_dim=7",
    "policy.gaussian.hidden_dims=[16]",
    "algo.critic_hidden_dims=[16,16]",
    "algo.num_critics=2",
    "algo.buffer_size=1000",  # allocated whole at the first transition
    "train.tensorboard=false",
    "train.keep_best=false",
    "train.eval_every=0",
]


@contextmanager
def serving_learner(overrides: list[str], run_dir: Path) -> Iterator[Learner]:
    """A learner whose server runs (its training loop does not: the test takes what arrives)."""
    learner = Learner(compose(None, overrides), run_dir, LearnerServerConfig(port=0))
    learner.server.start()
    try:
        yield learner
    finally:
        learner.server.stop()
        learner.intake.close()
        learner.env.close()


def connection(learner: Learner, **fields) -> ActorConnectionConfig:
    return ActorConnectionConfig(learner=f"ws://127.0.0.1:{learner.server.port}", wait_s=10, **fields)
