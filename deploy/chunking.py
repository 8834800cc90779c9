"""Chunk execution: turns action chunks [H, A] into one action per control step.

Steps are counted by the executor. A chunk computed from the observation of step `s` holds the
actions meant for steps s .. s+H-1; when it arrives at step t > s (inference took t - s steps) its
first t - s actions are already stale and are dropped, so every mode splices on the time axis.

- open_loop: execute N of H, then re-query (openpi's ActionChunkBroker with replanning); the loop
  waits for the next chunk.
- blend: re-query after N steps while the rest of the chunk keeps running; where old and new
  chunks overlap, new = w * new + (1 - w) * old (LeRobot async inference's weighted average).
- rtc: real-time chunking; the next query starts `inference_delay_steps` before N steps are done
  so that it lands in time, and the overlap is cross-faded linearly from old to new so the splice
  is continuous (the guidance-free form of Black et al.'s real-time chunking).
- guided_rtc: Black et al.'s real-time chunking: queries early as rtc, and each request carries the
  plan's remaining actions and the expected delay (deploy/guidance.py), toward which the policy
  inpaints the new chunk (flow policies: policies/flow/guidance.py); the new chunk then replaces the
  plan without blending, since it already continues it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embodrl.deploy.config import REAL_TIME_MODES, ChunkConfig
from embodrl.deploy.guidance import guidance_fields
from embodrl.errors import UserError


class ChunkExecutor:
    """The planned actions by control step; `pop_action` advances one step."""

    def __init__(self, cfg: ChunkConfig) -> None:
        self.cfg = cfg
        self.reset()

    def reset(self) -> None:
        self.step = 0  # the step whose action `pop_action` returns next
        self.plan: list[np.ndarray] = []  # plan[i] is the action for step self.step + i
        self.chunk_step: int | None = None  # observation step of the last accepted chunk

    @property
    def remaining(self) -> int:
        return len(self.plan)

    def wants_chunk(self) -> bool:
        """Whether the loop should start an inference now (given none is in flight)."""
        if not self.plan or self.chunk_step is None:
            return True
        if self.cfg.mode == "open_loop":
            return False  # its plan holds exactly N actions
        lead = self.cfg.inference_delay_steps if self.cfg.mode in REAL_TIME_MODES else 0
        return self.step - self.chunk_step >= self.cfg.execute_steps - lead

    def request_fields(self) -> dict[str, Any]:
        """Keys to add to a request sent now (guided_rtc: the plan's remaining actions and the delay)."""
        if self.cfg.mode != "guided_rtc":
            return {}
        return guidance_fields(self.plan, self.cfg.inference_delay_steps)

    def add_chunk(self, chunk: np.ndarray, obs_step: int) -> None:
        """Splice in a chunk [H, A] computed from the observation taken at step `obs_step`."""
        chunk = np.asarray(chunk, dtype=np.float64)
        if chunk.shape[0] != self.cfg.action_horizon:
            raise UserError(
                f"the policy returned chunks of {chunk.shape[0]} actions but chunk.action_horizon="
                f"{self.cfg.action_horizon}; training and deploy horizons must match (set it to the "
                "policy's chunk size)"
            )
        if obs_step > self.step:
            raise ValueError(
                f"a chunk from step {obs_step} cannot arrive before step {obs_step} (now {self.step})"
            )
        fresh = list(chunk[self.step - obs_step :])  # actions for steps self.step, self.step + 1, ...
        if self.cfg.mode == "open_loop":
            fresh = fresh[: max(0, obs_step + self.cfg.execute_steps - self.step)]
            self.plan = fresh
        elif self.cfg.mode == "guided_rtc":
            self.plan = fresh
        else:
            overlap = min(len(self.plan), len(fresh))
            for k in range(overlap):
                w = self.cfg.blend_new_weight if self.cfg.mode == "blend" else (k + 1) / (overlap + 1)
                fresh[k] = w * fresh[k] + (1 - w) * self.plan[k]
            self.plan = fresh
        self.chunk_step = obs_step

    def pop_action(self) -> np.ndarray | None:
        """The action for the current step (None if the plan ran dry), then advance one step."""
        self.step += 1
        return self.plan.pop(0) if self.plan else None
