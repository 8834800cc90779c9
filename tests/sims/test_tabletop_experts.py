"""Every scripted expert solves its task in >= 95% of 100 seeded episodes (state obs, no rendering)."""

import numpy as np
import pytest

from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env
from embodrl.sims.tabletop.tasks import TASK_NAMES

EPISODES = 100


@pytest.mark.parametrize("suite", ["tabletop-basic", "tabletop-lang"])
@pytest.mark.parametrize("task", TASK_NAMES)
def test_expert_succeeds(suite, task):
    env = make_env(EnvConfig(suite=suite, task=task, num_envs=EPISODES, max_episode_steps=80))
    env.reset(seed=123)
    success = np.zeros(EPISODES, bool)
    finished = np.zeros(EPISODES, bool)
    while not finished.all():
        res = env.step(env.expert_actions())
        success |= res.success.numpy() & ~finished
        finished |= res.done.numpy()
    assert success.mean() >= 0.95, f"{suite}/{task}: expert success {success.mean():.2f}"
