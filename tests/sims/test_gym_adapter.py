import importlib.util

import gymnasium as gym
import numpy as np
import pytest
import torch

from embodrl.errors import UserError
from embodrl.sims.config import EnvConfig
from embodrl.sims.gym_adapter import GymVecEnv, make_gym
from embodrl.sims.registry import make_env

from .vecenv_contract import check_vecenv_contract


def test_pendulum_passes_contract():
    cfg = EnvConfig(suite="gym", gym_id="InvertedPendulum-v5", num_envs=3, max_episode_steps=9)
    check_vecenv_contract(lambda: make_env(cfg))


class RecordingEnv(gym.Env):
    """Reward = the action it received; ends after 3 steps."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Box(np.array([0.0, -4.0], np.float32), np.array([2.0, 4.0], np.float32))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 2).astype(np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), float(action[0] + action[1]), False, self.t >= 3, {}


def test_chunk_stops_at_episode_end_and_maps_action_bounds():
    env = GymVecEnv([RecordingEnv, RecordingEnv])
    env.reset(seed=0)
    actions = torch.tensor([[1.0, 0.5], [-1.0, -1.0]])[:, None].expand(
        2, 5, 2
    )  # a chunk longer than the episode
    res = env.step(actions)
    assert res.truncated.all() and (res.steps_executed == 3).all()
    assert (res.reward[:, 3:] == 0).all()
    # [1, 0.5] maps to [2, 2] (sum 4) and [-1, -1] to the lower bounds [0, -4] (sum -4).
    assert torch.allclose(res.reward[:, :3], torch.tensor([[4.0], [-4.0]]).expand(2, 3))


def test_unknown_gym_id_is_a_user_error():
    with pytest.raises(UserError, match="unknown gymnasium id"):
        make_gym(EnvConfig(suite="gym", gym_id="NoSuchEnv-v0"))
    with pytest.raises(UserError, match="env.gym_id"):
        make_gym(EnvConfig(suite="gym"))


@pytest.mark.skipif(
    importlib.util.find_spec("pygame") is not None, reason="pygame draws classic control here"
)
def test_an_env_that_cannot_render_here_says_so_in_one_line():
    env = make_gym(EnvConfig(suite="gym", gym_id="Pendulum-v1", num_envs=1))
    env.reset()
    with pytest.raises(UserError, match="cannot render here.*--record 0") as error:
        env.render()
    assert "\n" not in str(error.value)
