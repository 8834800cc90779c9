"""Any gymnasium env id (or a list of env factories) as an embodrl VecEnv.

Observations: a Box observation becomes `state` float32 [N, S]. Actions: the policy acts in
[-1, 1] per dimension; the adapter maps them affinely onto the env's Box bounds (documented
clipping to [-1, 1] first). Each sub-env is stepped on its own so that an episode ending inside a
chunk drops the rest of the chunk exactly, as the contract requires.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from embodrl.errors import UserError
from embodrl.sims.base import ActionSpec, StepResult, TensorSpec, VecEnv
from embodrl.sims.config import EnvConfig

NUM_INIT_STATES = 2**31 - 1  # reset_to(id) is reset(seed=id): every seed is an initial state


class GymVecEnv(VecEnv):
    """N gymnasium envs behind the VecEnv contract (state observations, auto-reset, final_obs)."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], device: str = "cpu", name: str = "gym"):
        if not env_fns:
            raise UserError("GymVecEnv needs at least one env factory")
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self.device = torch.device(device)
        self.name = name
        obs_space, act_space = self.envs[0].observation_space, self.envs[0].action_space
        if not isinstance(obs_space, gym.spaces.Box) or not isinstance(act_space, gym.spaces.Box):
            raise UserError(
                f"{name}: only Box observation and action spaces are supported, got "
                f"{type(obs_space).__name__} / {type(act_space).__name__}"
            )
        if not (np.isfinite(act_space.low).all() and np.isfinite(act_space.high).all()):
            raise UserError(f"{name}: action space must be bounded to map [-1, 1] onto it")
        self._act_low = act_space.low.astype(np.float64)
        self._act_high = act_space.high.astype(np.float64)
        self._act_half_range = 0.5 * (self._act_high - self._act_low)
        self._state_dim = int(np.prod(obs_space.shape))
        self._action_spec = ActionSpec(dim=int(np.prod(self._act_low.shape)))  # read on every step
        self._obs = np.zeros((self.num_envs, self._state_dim), np.float32)

    @property
    def action_spec(self) -> ActionSpec:
        return self._action_spec

    @property
    def observation_spec(self) -> dict[str, TensorSpec]:
        return {
            "state": TensorSpec((self._state_dim,), torch.float32),
            "task_id": TensorSpec((), torch.int64),
        }

    @property
    def instruction_table(self) -> list[str]:
        return [self.name]

    @property
    def num_init_states(self) -> int:
        return NUM_INIT_STATES

    def _obs_td(self, obs: np.ndarray) -> TensorDict:
        state = torch.from_numpy(obs.copy()).to(self.device)  # float32 already
        task_id = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        return TensorDict(
            {"state": state, "task_id": task_id}, batch_size=[self.num_envs], device=self.device
        )

    def _reset_one(self, i: int, seed: int | None) -> None:
        obs, _ = self.envs[i].reset(seed=seed)
        self._obs[i] = np.asarray(obs, np.float32).reshape(-1)

    def reset(self, seed: int | None = None, options: dict | None = None) -> TensorDict:
        for i in range(self.num_envs):
            self._reset_one(i, None if seed is None else seed + i)
        return self._obs_td(self._obs)

    def reset_to(self, state_ids: torch.Tensor, env_ids: torch.Tensor | None = None) -> TensorDict:
        env_ids = self.check_state_ids(state_ids, env_ids)
        for i, sid in zip(env_ids.tolist(), torch.as_tensor(state_ids).flatten().tolist(), strict=True):
            self._reset_one(i, int(sid))
        return self._obs_td(self._obs)

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = self.check_actions(actions).cpu().numpy().astype(np.float64)  # [N, C, A]
        n, chunk = actions.shape[:2]
        scaled = self._act_low + (actions + 1.0) * self._act_half_range  # exact: halving rounds nothing
        reward = np.zeros((n, chunk), np.float32)
        terminated, truncated, success = (np.zeros(n, bool) for _ in range(3))
        executed = np.zeros(n, np.int64)
        final = self._obs.copy()
        for i, env in enumerate(self.envs):
            for c in range(chunk):
                obs, r, term, trunc, info = env.step(scaled[i, c].reshape(self._act_low.shape))
                reward[i, c], executed[i] = r, c + 1
                final[i] = np.asarray(obs, np.float32).reshape(-1)
                success[i] |= bool(info.get("is_success", False))
                if term or trunc:
                    terminated[i], truncated[i] = term, trunc and not term
                    break
            if terminated[i] or truncated[i]:
                self._reset_one(i, None)
            else:
                self._obs[i] = final[i]
        as_t = lambda a: torch.from_numpy(a).to(self.device)  # a third of as_tensor's cost
        obs = self._obs_td(self._obs)
        return StepResult.build(
            obs=obs,
            reward=as_t(reward),
            terminated=as_t(terminated),
            truncated=as_t(truncated),
            success=as_t(success),
            final_obs=self._obs_td(final) if (terminated | truncated).any() else obs,
            steps_executed=as_t(executed),
            device=self.device,
        )

    def render(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        ids = range(self.num_envs) if env_ids is None else torch.as_tensor(env_ids).flatten().tolist()
        try:
            frames = [self.envs[i].render() for i in ids]
        except gym.error.DependencyNotInstalled as error:  # e.g. classic control draws with pygame
            raise UserError(
                f"{self.name} cannot render here ({str(error).splitlines()[0]}); install what it names, or "
                "record no videos (--record 0, train.videos=0, sft.videos=0)"
            ) from None
        if any(f is None for f in frames):
            raise UserError(f"{self.name}: rendering needs the env made with render_mode='rgb_array'")
        return torch.as_tensor(np.stack(frames), dtype=torch.uint8)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def make_gym(cfg: EnvConfig, device: str = "cpu") -> GymVecEnv:
    """Build `cfg.num_envs` copies of the gymnasium env `cfg.gym_id`."""
    if not cfg.gym_id:
        raise UserError("suite 'gym' needs env.gym_id=<a gymnasium id>, e.g. env.gym_id=Pendulum-v1")
    if cfg.gym_id not in gym.registry:
        raise UserError(
            f"unknown gymnasium id {cfg.gym_id!r}; gymnasium.pprint_registry() lists the valid ones"
        )

    def factory() -> gym.Env:
        return gym.make(cfg.gym_id, max_episode_steps=cfg.max_episode_steps, render_mode="rgb_array")

    return GymVecEnv([factory] * cfg.num_envs, device=device, name=cfg.gym_id)
