"""Every scripted expert solves its task in >= 95% of 100 seeded episodes (state obs, no rendering)."""

import numpy as np
import pytest
import torch

from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env
from embodrl.sims.tabletop.controller import POS_SCALE
from embodrl.sims.tabletop.scene import CUBE_HALF
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


def test_expert_turns_about_the_vertical_only_from_a_tilted_hand():
    """Under DAgger a policy drives and may tilt the hand; the expert's labels keep roll and pitch at zero,
    which the demos hold constant (a policy normalizes them by a zero spread)."""
    env = make_env(EnvConfig(suite="tabletop-lang", task="pick", num_envs=8, max_episode_steps=80))
    env.reset(seed=0)
    tilt = torch.zeros(8, 1, 7)
    tilt[..., 3:5] = 0.5  # roll and pitch
    for _ in range(3):
        env.step(tilt)
    actions = env.expert_actions().numpy()
    assert not actions[:, 3:5].any() and np.abs(actions[:, :3]).max() > 0


def test_expert_goes_on_down_from_a_hand_that_came_in_low_and_level_with_the_cube():
    """A policy under DAgger may skip the expert's waypoint above the cube; from a hand already level with the
    cube and low, the expert's label descends to grasp instead of rising back to the waypoint."""
    env = make_env(EnvConfig(suite="tabletop-lang", task="pick", num_envs=4, max_episode_steps=80))
    env.reset(seed=0)
    for _ in range(40):  # straight at a point 3 cm over the named cube, not through the waypoint 8 cm over
        frame = env._frame()
        wanted = frame.main + np.array([0.0, 0.0, 0.03])
        move = np.clip((wanted - env._controller.target_pos) / POS_SCALE, -1.0, 1.0)
        actions = torch.zeros(4, 1, 7)
        actions[:, 0, :3] = torch.from_numpy(move)
        actions[:, 0, 6] = -1.0
        env.step(actions)
    frame = env._frame()
    level = np.linalg.norm(frame.ee[:, :2] - frame.main[:, :2], axis=-1) < 0.01
    assert level.sum() >= 3
    actions = env.expert_actions().numpy()[level]
    assert (actions[:, 2] < 0).all() and (actions[:, 6] == -1.0).all()  # down, open


def test_expert_carries_on_a_cube_another_driver_lifted():
    """Under DAgger the policy may grasp and lift before the expert's own grasp phase; the expert's label
    then keeps the gripper closed and lifts, not back down to grasp with the gripper open."""
    env = make_env(EnvConfig(suite="tabletop-lang", task="pick", num_envs=4, max_episode_steps=80))
    env.reset(seed=0)
    lifted = np.zeros(4, bool)
    for _ in range(80):  # the expert grasps and starts lifting (success, 5 cm up, would end the episode)
        env.step(env.expert_actions()[:, None])
        lifted = env._frame().main[:, 2] > CUBE_HALF + 0.015
        if lifted.any():
            break
    assert lifted.any()
    env._expert.reset(np.arange(4))  # as if a policy had done it: the expert's phases start over
    actions = env.expert_actions().numpy()[lifted]
    assert (actions[:, 6] == 1.0).all() and (actions[:, 2] > 0).all()  # closed, up
