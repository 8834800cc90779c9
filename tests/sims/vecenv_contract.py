"""Checks every VecEnv must pass; each adapter's test module calls `check_vecenv_contract`."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict

from embodrl.errors import UserError
from embodrl.obs_keys import OBS_KEYS
from embodrl.sims.base import StepResult, VecEnv


def _check_obs(env: VecEnv, obs: TensorDict) -> None:
    assert isinstance(obs, TensorDict)
    assert obs.batch_size == torch.Size([env.num_envs])
    assert set(obs.keys()) <= set(OBS_KEYS), f"unexpected observation keys {set(obs.keys()) - set(OBS_KEYS)}"
    spec = env.observation_spec
    assert set(obs.keys()) == set(spec), "observation keys differ from observation_spec"
    for key, s in spec.items():
        assert obs[key].dtype == s.dtype, key
        assert tuple(obs[key].shape[1:]) == s.shape, key
        if obs[key].is_floating_point():
            assert torch.isfinite(obs[key]).all(), key
    if "task_id" in obs:
        ids = obs["task_id"]
        assert ((ids >= 0) & (ids < len(env.instruction_table))).all()
        assert all(isinstance(s, str) and s for s in env.instructions(ids))
        assert env.instruction_tasks == [] or len(env.instruction_tasks) == len(env.instruction_table)


def _random_actions(env: VecEnv, chunk: int, generator: torch.Generator) -> torch.Tensor:
    spec = env.action_spec
    u = torch.rand(env.num_envs, chunk, spec.dim, generator=generator)
    return spec.low + (spec.high - spec.low) * u


def check_vecenv_contract(make_env: Callable[[], VecEnv], chunk: int = 2, steps: int = 30) -> None:
    """Shapes, dtypes (episode flags: those the env names), reset/reset_to determinism, auto-reset with
    final_obs, bad-input errors."""
    env = make_env()
    try:
        gen = torch.Generator().manual_seed(0)
        obs = env.reset(seed=3)
        _check_obs(env, obs)
        assert env.action_spec.dim >= 1 and env.action_spec.low < env.action_spec.high

        # Seeded resets reproduce the same observation.
        again = env.reset(seed=3)
        for key in obs.keys():
            assert torch.equal(obs[key], again[key]), f"reset(seed) not reproducible for {key!r}"

        # reset_to: same id -> identical initial observation, whatever env holds it.
        ids = torch.zeros(env.num_envs, dtype=torch.long)
        first = env.reset_to(ids)
        _check_obs(env, first)
        for key in first.keys():
            assert (first[key] == first[key][:1]).all(), f"reset_to same id differs across envs in {key!r}"

        saw_done = False
        for _ in range(steps):
            res = env.step(_random_actions(env, chunk, gen))
            assert isinstance(res, StepResult)
            _check_obs(env, res.obs)
            _check_obs(env, res.final_obs)
            assert res.reward.shape == (env.num_envs, chunk) and res.reward.dtype == torch.float32
            assert set(res.episode_flags.keys()) == set(env.episode_flag_names)
            for flag in (res.terminated, res.truncated, res.success, *res.episode_flags.values()):
                assert flag.shape == (env.num_envs,) and flag.dtype == torch.bool
            assert ((res.steps_executed >= 1) & (res.steps_executed <= chunk)).all()
            # Rewards after the episode's end inside a chunk are zero.
            after_end = torch.arange(chunk) >= res.steps_executed[:, None]
            assert (res.reward[after_end] == 0).all()
            running = ~res.done
            for key in res.obs.keys():
                assert torch.equal(res.obs[key][running], res.final_obs[key][running]), key
            saw_done |= bool(res.done.any())
        assert saw_done, "no episode ended: shorten max_episode_steps for the contract test"

        # Bad input: clear errors, not silent misbehaviour.
        bad = _random_actions(env, chunk, gen)
        bad[1 % env.num_envs, 0, 0] = float("nan")
        with pytest.raises(UserError, match=str(1 % env.num_envs)):
            env.step(bad)
        with pytest.raises(UserError, match="shape"):
            env.step(torch.zeros(env.num_envs + 1, chunk, env.action_spec.dim))
        with pytest.raises(UserError):
            env.step(torch.zeros(env.num_envs, chunk, env.action_spec.dim, dtype=torch.long))
        with pytest.raises(UserError, match="out of range"):
            env.reset_to(torch.full((env.num_envs,), env.num_init_states, dtype=torch.long))

        frames = env.render(torch.tensor([0]))
        assert (
            frames.dtype == torch.uint8
            and frames.dim() == 4
            and frames.shape[0] == 1
            and frames.shape[-1] == 3
        )
    finally:
        env.close()
