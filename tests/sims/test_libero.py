"""LIBERO adapter tests; they run in .venv-libero (`make test-libero`), LIBERO pins mujoco<4."""

import pytest
import torch

from embodrl.errors import UserError
from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env

from .vecenv_contract import check_vecenv_contract

pytest.importorskip("libero.libero", reason="LIBERO not installed here: run `make test-libero`")


def _cfg(**overrides) -> EnvConfig:
    base = dict(suite="libero-spatial", task="0", num_envs=2, max_episode_steps=3, image_size=64)
    return EnvConfig(**{**base, **overrides})


def test_libero_spatial_passes_contract_across_worker_processes():
    check_vecenv_contract(lambda: make_env(_cfg(num_threads=2)), chunk=2, steps=2)


def test_worker_processes_match_in_process_stepping():
    actions = torch.linspace(-1, 1, 2 * 2 * 7).reshape(2, 2, 7)
    states = []
    for workers in (1, 2):
        env = make_env(_cfg(suite="libero-goal", task=None, num_threads=workers, max_episode_steps=10))
        try:
            first = env.reset_to(torch.tensor([7, 8]))
            assert first["task_id"].tolist() == [0, 5]  # 10 tasks over 2 envs: blocks of 5
            states.append(env.step(actions).obs["state"])
        finally:
            env.close()
    torch.testing.assert_close(states[0], states[1])


def test_init_states_reproduce_and_actions_change_the_scene():
    env = make_env(_cfg(suite="libero-object", num_envs=1, max_episode_steps=20, obs_mode="rgb"))
    try:
        a = env.reset_to(torch.tensor([3]))
        b = env.reset_to(torch.tensor([3]))
        c = env.reset_to(torch.tensor([4]))
        assert torch.equal(a["rgb"], b["rgb"]) and torch.equal(a["state"], b["state"])
        assert not torch.equal(a["rgb"], c["rgb"])
        assert a["rgb"].shape == (1, 64, 64, 3) and a["rgb"].float().std() > 5
        assert env.instructions(a["task_id"]) == ["pick up the alphabet soup and place it in the basket"]
        up = torch.zeros(1, 3, 7)
        up[..., 2] = 1.0  # move the end effector up
        res = env.step(up)
        assert (res.obs["state"][:, 2] - c["state"][:, 2] > 0.01).all()
        assert not torch.equal(res.obs["rgb"], c["rgb"])
        assert not res.success.any() and (res.reward == 0).all()
    finally:
        env.close()


def test_bad_task_reward_and_assets_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="black_bowl"):
        make_env(_cfg(task="no_such_task"))
    with pytest.raises(UserError, match="env.reward=sparse"):
        make_env(_cfg(reward="dense"))
    with pytest.raises(UserError, match="assets are missing"):
        make_env(_cfg(libero_assets=str(tmp_path)))
