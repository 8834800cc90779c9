"""A VecEnv that passes everything through to the env it wraps: the base of wrappers that change one part."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from embodrl.sims.base import ActionSpec, StepResult, TensorSpec, VecEnv


class WrappedEnv(VecEnv):
    """Forwards every VecEnv method and property to `env`; a subclass overrides what it changes."""

    def __init__(self, env: VecEnv) -> None:
        self.env = env
        self.num_envs, self.device = env.num_envs, env.device

    @property
    def action_spec(self) -> ActionSpec:
        return self.env.action_spec

    @property
    def observation_spec(self) -> dict[str, TensorSpec]:
        return self.env.observation_spec

    @property
    def instruction_table(self) -> list[str]:
        return self.env.instruction_table

    @property
    def num_init_states(self) -> int:
        return self.env.num_init_states

    @property
    def episode_flag_names(self) -> tuple[str, ...]:
        return self.env.episode_flag_names

    @property
    def instruction_tasks(self) -> list[str]:
        return self.env.instruction_tasks

    def reset(self, seed: int | None = None, options: dict | None = None) -> TensorDict:
        return self.env.reset(seed, options)

    def reset_to(self, state_ids: torch.Tensor, env_ids: torch.Tensor | None = None) -> TensorDict:
        return self.env.reset_to(state_ids, env_ids)

    def step(self, actions: torch.Tensor) -> StepResult:
        return self.env.step(actions)

    def render(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.env.render(env_ids)

    def expert_actions(self) -> torch.Tensor:
        return self.env.expert_actions()

    def task_progress(self) -> torch.Tensor:
        return self.env.task_progress()

    def instructions(self, task_id: torch.Tensor) -> list[str]:
        return self.env.instructions(task_id)

    def pop_timings(self) -> dict[str, float]:
        return self.env.pop_timings()

    def close(self) -> None:
        self.env.close()
