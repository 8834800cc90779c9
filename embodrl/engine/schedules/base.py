"""What every schedule shares: the Schedule interface, the CollectedRollout it returns, how a decision is
stored."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from tensordict import TensorDict
from torch import nn

from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.engine.env_client import StagedEnv
from embodrl.engine.episode_tracker import EpisodeTracker
from embodrl.engine.inference_worker import InferenceWorker
from embodrl.policies.base import ActOut
from embodrl.sims.base import StepResult

InitialStates = Callable[[], torch.Tensor]  # state ids [N] for the episodes of the next rollout


@dataclass
class CollectedRollout:
    """A filled buffer (with `version` [T, N]: the weight version of every decision) and its statistics."""

    buffer: RolloutBuffer
    timings: dict[str, float]  # seconds: rollout (wall), inference, env_step, env_wait, weight_sync
    episodes: dict[str, float]  # outcomes of the episodes that finished: episodes, return, length, success,
    # and the env's episode flags


def transition(obs: TensorDict, out: ActOut, res: StepResult, bootstrap: torch.Tensor) -> TensorDict:
    """One decision of a batch of envs, in the layout RolloutBuffer.add expects."""
    return TensorDict(
        {
            "obs": obs,
            "actions": out.actions,
            "logprob": out.logprob,
            "value": out.value,
            "replay": out.replay,
            "reward": res.reward,
            "steps_executed": res.steps_executed,
            "terminated": res.terminated,
            "truncated": res.truncated,
            "success": res.success,
            "episode_flags": res.episode_flags,
            "bootstrap_value": bootstrap,
        },
        batch_size=obs.batch_size,
    )


def bootstrap_value(inference: InferenceWorker, out: ActOut, res: StepResult) -> torch.Tensor:
    """V(final_obs) [n] where an episode was truncated (the return continues past the time limit), else 0."""
    bootstrap = torch.zeros_like(out.value)
    truncated = res.truncated.to(bootstrap.device)
    if inference.lockstep:  # whether an env truncated differs between ranks, so every rank runs V on all envs
        bootstrap[truncated] = inference.value(res.final_obs)[truncated]
    elif truncated.any():
        bootstrap[truncated] = inference.value(res.final_obs[res.truncated])
    return bootstrap


class Schedule(ABC):
    """Fills a RolloutBuffer with T decisions of every env of a StagedEnv, through an InferenceWorker."""

    def __init__(
        self,
        env: StagedEnv,
        inference: InferenceWorker,
        buffer: RolloutBuffer,
        continue_episodes: bool = False,
    ) -> None:
        self.env, self.inference, self.buffer = env, inference, buffer
        self.tracker = EpisodeTracker.zeros(env.num_envs)
        # False: every rollout resets all envs to fresh initial states (grouped rollouts, episode-sized
        # rollouts, exact resume). True: a rollout continues the episodes the previous one cut off
        # (fixed-length windows); only the first rollout, or one after a failed env worker, resets.
        self.continue_episodes = continue_episodes
        self._next_obs: TensorDict | None = None

    @abstractmethod
    def collect(self, initial_states: InitialStates) -> CollectedRollout:
        """Reset the envs to `initial_states()` (unless continuing episodes) and return a full rollout."""

    def discard(self) -> None:
        """Forget where the last rollout's episodes stood: the next collect resets every env (after a
        rollout that is retried although it returned)."""
        self._next_obs = None

    def push_weights(self, policy: nn.Module, version: int) -> None:
        """The actor's weights after update `version`; the inference worker acts with them from its next
        decision on."""
        self.inference.push_weights(policy, version)

    def paused(self) -> AbstractContextManager[None]:
        """No rollout decision is made inside (an async producer waits at its next one)."""
        return self.inference.paused()

    def close(self) -> None:
        self.inference.close()


class SyncSchedule(Schedule):
    """A schedule whose rollout happens inside `collect`, with the newest weights throughout."""

    def collect(self, initial_states: InitialStates) -> CollectedRollout:
        self.env.timer.pop()  # drop what was timed between rollouts (evaluation, resets)
        start = time.perf_counter()
        self.inference.sync()
        obs, self._next_obs = self._next_obs, None  # cleared first: a failed attempt resets on retry
        states = None  # initial states to reset to, or continue from `obs`
        if obs is None or not self.continue_episodes:
            obs, states = None, initial_states()
            # also forgets a failed attempt's episodes
            limit = None if self.continue_episodes else self.env.env_cfg.max_episode_steps
            self.tracker = EpisodeTracker.zeros(self.env.num_envs, limit)
        self.buffer.clear()
        self.versions: list[int] = []  # weight version of each decision
        policy = self.inference.policy
        training = policy.training
        policy.eval()
        try:
            obs, last_value = self.run(obs, states)
            self.buffer.set_last_value(last_value)
        finally:
            policy.train(training)
        self._next_obs = obs
        data = self.buffer.data
        versions = torch.tensor(self.versions, device=data.device)  # [T]
        data.set("version", versions[:, None].expand(data.batch_size).clone())
        done = data["terminated"] | data["truncated"]
        self.tracker.record_rollout(
            data["reward"], data["steps_executed"], done, data["success"], data["episode_flags"]
        )
        timings = self.env.timer.pop()
        timings["rollout"] = time.perf_counter() - start  # wall time of the whole rollout, resets included
        return CollectedRollout(self.buffer, timings, self.tracker.pop())

    def next_decision(self) -> int:
        """Apply weights pushed since the last decision (in-flight update); returns the acting version."""
        self.inference.sync()
        self.versions.append(self.inference.version)
        return self.inference.version

    @abstractmethod
    def run(self, obs: TensorDict | None, states: torch.Tensor | None) -> tuple[TensorDict, torch.Tensor]:
        """Fill the buffer with T decisions from `obs` [N], or from the envs reset to `states` [N] when given;
        return the observation after the last decision and its value (the bootstrap of the window)."""
