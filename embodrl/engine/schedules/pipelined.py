"""Pipelined schedule (RLinf-VLA's hybrid fine-grained pipeline): stage i simulates while stage i+1 infers.

The env worker steps its K stages one after another; the inference worker infers a stage as soon as
its observation is back and sends its actions, so with K >= 2 the simulation of one stage overlaps
the inference of another. Ideal speedup over sequential: (t_sim + t_inf) / max(t_sim, t_inf).
The pipeline's fill and drain overlap too: stage s+1 resets while stage s infers its first actions,
and stage s's final observation is valued while stage s+1 takes its last step.
Every env sees the same observations and actions as under the sequential schedule; only the order
of work changes (same trajectories for a deterministic policy).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from embodrl.engine.schedules.base import SyncSchedule, bootstrap_value, transition
from embodrl.policies.base import ActOut


class PipelinedSchedule(SyncSchedule):
    """T decisions of K stages, interleaved so that inference and simulation overlap."""

    def run(self, obs: TensorDict | None, states: torch.Tensor | None) -> tuple[TensorDict, torch.Tensor]:
        env, steps = self.env, self.buffer.num_steps
        if states is not None:  # stage s+1 resets while stage s infers its first actions
            env.send_reset_to(states)
        stage_obs: list[TensorDict] = []  # [N/K] each
        outs: list[ActOut] = []
        last_values: list[torch.Tensor] = []  # V of each stage's final observation, while the next simulates
        version = self.next_decision()
        for s in range(env.num_stages):  # prime the pipeline: every stage gets its first actions
            stage_obs.append(env.recv_reset(s) if states is not None else obs[env.stage_slice(s)])
            outs.append(self.inference.act(stage_obs[s]))
            env.send_step(s, outs[s].actions, version, 0)
        for step in range(steps):
            if step + 1 < steps:  # every stage's next decision uses the same weights
                version = self.next_decision()
            parts = []
            for s in range(env.num_stages):
                res = env.recv_step(s)  # meanwhile the worker went on with stage s+1
                bootstrap = bootstrap_value(self.inference, outs[s], res)
                parts.append(transition(stage_obs[s], outs[s], res, bootstrap))
                stage_obs[s] = res.obs
                if step + 1 < steps:
                    outs[s] = self.inference.act(stage_obs[s])
                    env.send_step(s, outs[s].actions, version, step + 1)
                else:
                    last_values.append(self.inference.value(stage_obs[s]))
            self.buffer.add(torch.cat(parts))
        return torch.cat(stage_obs), torch.cat(last_values)
