"""A test env whose success does not end its episodes (env.terminate_on_success=false): the task is done
from step 3 + s % 3 on for state ids s with s % 4 != 3, never for the others; it truncates after 20 steps."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from embodrl.sims.base import ActionSpec, StepResult, TensorSpec, VecEnv

LIMIT = 20


def success_step(state_id: int) -> int | None:
    """The first step whose state shows the task done, None for a failing state id."""
    return None if state_id % 4 == 3 else 3 + state_id % 3


class HoldingEnv(VecEnv):
    def __init__(self, num_envs: int = 2):
        self.num_envs, self.device = num_envs, torch.device("cpu")
        self.state_id = np.zeros(num_envs, dtype=np.int64)
        self.t = np.zeros(num_envs, dtype=np.int64)

    @property
    def action_spec(self) -> ActionSpec:
        return ActionSpec(2)

    @property
    def observation_spec(self) -> dict[str, TensorSpec]:
        return {"state": TensorSpec((2,), torch.float32), "rgb": TensorSpec((8, 8, 3), torch.uint8)}

    @property
    def instruction_table(self) -> list[str]:
        return ["hold it"]

    @property
    def num_init_states(self) -> int:
        return 100

    def _success(self) -> np.ndarray:
        return np.array(
            [
                success_step(s) is not None and t >= success_step(s)
                for s, t in zip(self.state_id, self.t, strict=True)
            ]
        )

    def _obs(self) -> TensorDict:
        rgb = np.broadcast_to((self._success() * 200)[:, None, None, None], (self.num_envs, 8, 8, 3))
        return TensorDict(
            {
                "state": torch.tensor(np.stack([self.state_id, self.t], -1), dtype=torch.float32),
                "rgb": torch.from_numpy(rgb.astype(np.uint8)),
            },
            batch_size=[self.num_envs],
        )

    def reset(self, seed=None, options=None) -> TensorDict:
        return self.reset_to(torch.arange(self.num_envs))

    def reset_to(self, state_ids, env_ids=None) -> TensorDict:
        env_ids = self.check_state_ids(state_ids, env_ids).numpy()
        self.state_id[env_ids] = torch.as_tensor(state_ids).numpy()
        self.t[env_ids] = 0
        return self._obs()

    def expert_actions(self) -> torch.Tensor:
        return torch.zeros(self.num_envs, 2)

    def step(self, actions: torch.Tensor) -> StepResult:
        self.check_actions(actions)
        self.t += 1
        success = self._success()
        truncated = self.t >= LIMIT
        final = self._obs()
        self.t[truncated] = 0  # auto-reset
        n = self.num_envs
        return StepResult(
            obs=self._obs(),
            reward=torch.from_numpy(success.astype(np.float32))[:, None],
            terminated=torch.zeros(n, dtype=torch.bool),
            truncated=torch.from_numpy(truncated),
            success=torch.from_numpy(success),
            final_obs=final,
            steps_executed=torch.ones(n, dtype=torch.int64),
            batch_size=[n],
        )

    def render(self, env_ids=None) -> torch.Tensor:
        return self._obs()["rgb"]
