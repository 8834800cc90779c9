import pytest

from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env

from .vecenv_contract import check_vecenv_contract


@pytest.mark.parametrize("suite", ["tabletop-basic", "tabletop-lang"])
def test_state_envs_pass_contract(suite):
    cfg = EnvConfig(suite=suite, num_envs=4, max_episode_steps=7)
    check_vecenv_contract(lambda: make_env(cfg))


def test_rgb_env_passes_contract():
    cfg = EnvConfig(num_envs=2, max_episode_steps=5, obs_mode="rgb", image_size=64, wrist_camera=True)
    check_vecenv_contract(lambda: make_env(cfg), steps=8)
