"""Schedules by name: sequential, pipelined, async; each fills a RolloutBuffer through `collect`."""

from __future__ import annotations

from torch import nn

from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.engine.config import EngineConfig
from embodrl.engine.env_client import StagedEnv
from embodrl.engine.inference_worker import InferenceWorker
from embodrl.engine.schedules.asynchronous import AsyncSchedule
from embodrl.engine.schedules.base import CollectedRollout, InitialStates, Schedule
from embodrl.engine.schedules.pipelined import PipelinedSchedule
from embodrl.engine.schedules.sequential import SequentialSchedule

__all__ = ["CollectedRollout", "InitialStates", "Schedule", "make_schedule"]


def make_schedule(
    cfg: EngineConfig,
    env: StagedEnv,
    policy: nn.Module,
    buffer: RolloutBuffer,
    device: str,
    continue_episodes: bool = False,
) -> Schedule:
    """The schedule named by `cfg.schedule`, with an inference worker placed as `cfg.placement` says.

    continue_episodes: rollouts carry episodes over instead of resetting every env (Schedule)."""
    copy = cfg.schedule == "async" or cfg.placement == "disaggregated"
    inference = InferenceWorker(policy, env.timer, copy_to=(cfg.rollout_device or device) if copy else None)
    if cfg.schedule == "sequential":
        return SequentialSchedule(env, inference, buffer, continue_episodes)
    if cfg.schedule == "pipelined":
        return PipelinedSchedule(env, inference, buffer, continue_episodes)
    # async: the producer thread runs the pipelined loop when there are stages to overlap
    inner = (PipelinedSchedule if cfg.num_stages > 1 else SequentialSchedule)(
        env, inference, buffer, continue_episodes
    )
    return AsyncSchedule(inner, cfg.max_staleness)
