"""A scripted test env whose episode length, success and instruction follow the initial-state id."""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from embodrl.sims.base import ActionSpec, StepResult, TensorSpec, VecEnv

INSTRUCTIONS = ["reach the red target", "push the blue cube"]
TASKS = ["reach", "push"]  # of each instruction, with `tasks`
FLAG = "every_fourth"


class CountingEnv(VecEnv):
    """Episodes from state id s last 3 + s % 4 steps, fail when s % 5 == 4, use instruction s % 2; with
    `flags`, the episode flag FLAG is set in episodes from s % 4 == 0; with `tasks` it names each
    instruction's task (TASKS).

    The expert's action encodes (state id, step) so labels can be checked; executed actions are logged.
    """

    def __init__(self, num_envs: int = 3, image: bool = True, flags: bool = False, tasks: bool = False):
        self.num_envs, self.device, self.image, self.flags = num_envs, torch.device("cpu"), image, flags
        self.tasks = tasks
        self.state_id = np.zeros(num_envs, dtype=np.int64)
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.executed: dict[int, list[np.ndarray]] = {}  # state id -> actions executed

    @property
    def action_spec(self) -> ActionSpec:
        return ActionSpec(3, names=("a", "b", "c"))

    @property
    def observation_spec(self) -> dict[str, TensorSpec]:
        spec = {"state": TensorSpec((2,), torch.float32), "task_id": TensorSpec((), torch.int64)}
        if self.image:
            spec["rgb"] = TensorSpec((16, 16, 3), torch.uint8)
        return spec

    @property
    def instruction_table(self) -> list[str]:
        return INSTRUCTIONS

    @property
    def instruction_tasks(self) -> list[str]:
        return TASKS if self.tasks else []

    @property
    def num_init_states(self) -> int:
        return 1000

    @property
    def episode_flag_names(self) -> tuple[str, ...]:
        return (FLAG,) if self.flags else ()

    def _obs(self) -> TensorDict:
        obs = {
            "state": torch.tensor(np.stack([self.state_id, self.t], -1), dtype=torch.float32),
            "task_id": torch.from_numpy(self.state_id % 2),
        }
        if self.image:
            obs["rgb"] = torch.from_numpy(
                np.broadcast_to((self.t * 20)[:, None, None, None], (self.num_envs, 16, 16, 3)).astype(
                    np.uint8
                )
            )
        return TensorDict(obs, batch_size=[self.num_envs])

    def reset(self, seed=None, options=None) -> TensorDict:
        return self.reset_to(torch.arange(self.num_envs))

    def reset_to(self, state_ids, env_ids=None) -> TensorDict:
        env_ids = self.check_state_ids(state_ids, env_ids).numpy()
        self.state_id[env_ids] = torch.as_tensor(state_ids).numpy()
        self.t[env_ids] = 0
        for s in self.state_id[env_ids]:
            self.executed[int(s)] = []
        return self._obs()

    def expert_actions(self) -> torch.Tensor:
        return torch.tensor(
            np.stack([self.state_id / 1000, self.t / 10, np.zeros(self.num_envs)], -1), dtype=torch.float32
        )

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = self.check_actions(actions)
        for i, s in enumerate(self.state_id):
            self.executed[int(s)].append(actions[i, 0].numpy().copy())
        self.t += 1
        done = self.t >= 3 + self.state_id % 4
        success = done & (self.state_id % 5 != 4)
        flags = {FLAG: torch.from_numpy(self.state_id % 4 == 0)} if self.flags else {}
        final = self._obs()
        for i in np.flatnonzero(done):  # auto-reset to some other state
            self.state_id[i], self.t[i] = 999, 0
            self.executed[999] = []
        n = self.num_envs
        return StepResult(
            obs=self._obs(),
            reward=torch.from_numpy(success.astype(np.float32))[:, None],
            terminated=torch.from_numpy(done),
            truncated=torch.zeros(n, dtype=torch.bool),
            success=torch.from_numpy(success),
            final_obs=final,
            steps_executed=torch.ones(n, dtype=torch.int64),
            episode_flags=TensorDict(flags, batch_size=[n]),
            batch_size=[n],
        )

    def render(self, env_ids=None) -> torch.Tensor:
        return self._obs()["rgb"]
