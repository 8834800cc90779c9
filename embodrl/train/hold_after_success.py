"""Collect's view of an env: episodes go on `hold_steps` steps past their first success, and each observation
comes with the success label of the state it shows (what a learned success reward is trained on)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from embodrl.sims.base import StepResult, VecEnv
from embodrl.sims.wrapped import WrappedEnv


class HoldAfterSuccess(WrappedEnv):
    """Wraps an env whose own success does not end its episodes (`env.terminate_on_success=false`) when
    `hold_steps > 0`: an episode ends `hold_steps` steps after its first success (its outcome: the success
    of that last step), or unsuccessful after `max_steps` (None: when the env ends it). With `hold_steps=0`
    it ends at the first success, as the env would. `success_now` [N] tells, for the observation the last
    call returned, whether the task is done in that state. Envs it ends are not reset: the caller resets
    them (`reset_to`), as collect does."""

    def __init__(self, env: VecEnv, hold_steps: int, max_steps: int | None = None) -> None:
        super().__init__(env)
        self.hold_steps, self.max_steps = hold_steps, max_steps
        self.steps = torch.zeros(self.num_envs, dtype=torch.long)
        self.since_success = torch.full((self.num_envs,), -1)  # steps since the first success; -1: none yet
        self.success_now = torch.zeros(self.num_envs, dtype=torch.bool)

    def _clear(self, env_ids: torch.Tensor) -> None:
        self.steps[env_ids], self.since_success[env_ids], self.success_now[env_ids] = 0, -1, False

    def reset(self, seed: int | None = None, options: dict | None = None) -> TensorDict:
        self._clear(torch.arange(self.num_envs))
        return self.env.reset(seed, options)

    def reset_to(self, state_ids: torch.Tensor, env_ids: torch.Tensor | None = None) -> TensorDict:
        env_ids = self.check_state_ids(state_ids, env_ids)
        self._clear(env_ids)
        return self.env.reset_to(state_ids, env_ids)

    def step(self, actions: torch.Tensor) -> StepResult:
        res = self.env.step(actions)
        success = res.success.cpu()
        inner_done = res.done.cpu()
        self.steps += res.steps_executed.cpu()
        held = self.since_success >= 0
        self.since_success[held] += res.steps_executed.cpu()[held]
        self.since_success[~held & success] = 0
        ended = (self.since_success >= self.hold_steps) & ~inner_done
        timed_out = torch.zeros_like(ended)
        if self.max_steps is not None:
            timed_out = (self.steps >= self.max_steps) & (self.since_success < 0) & ~inner_done
        # the env reset the episodes it ended itself: their observation is a new episode's first
        self.success_now = success & ~inner_done
        self._clear(inner_done.nonzero().flatten())
        return res.with_fields(
            terminated=res.terminated | ended.to(res.terminated.device),
            truncated=res.truncated | timed_out.to(res.truncated.device),
        )
