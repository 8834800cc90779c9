"""Sequential schedule: infer all N envs, then step all N envs (the baseline of every speedup)."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from embodrl.engine.schedules.base import SyncSchedule, bootstrap_value, transition


class SequentialSchedule(SyncSchedule):
    """T times: actions for every env, then one step of every env."""

    def run(self, obs: TensorDict | None, states: torch.Tensor | None) -> tuple[TensorDict, torch.Tensor]:
        if states is not None:
            obs = self.env.reset_to(states)
        for _ in range(self.buffer.num_steps):
            self.next_decision()
            out = self.inference.act(obs)
            res = self.env.step(out.actions)
            self.buffer.add(transition(obs, out, res, bootstrap_value(self.inference, out, res)))
            obs = res.obs
        return obs, self.inference.value(obs)
