"""Sequential rollout schedule: the policy acts on all envs, then all envs step (the engine's baseline)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.sims.base import VecEnv


@dataclass
class EpisodeTracker:
    """Running return/length per env and the outcomes of episodes finished since the last `pop`."""

    returns: torch.Tensor
    lengths: torch.Tensor
    finished: list[tuple[float, int, bool]] = field(default_factory=list)

    @classmethod
    def zeros(cls, num_envs: int) -> EpisodeTracker:
        return cls(torch.zeros(num_envs), torch.zeros(num_envs, dtype=torch.long))

    def record(
        self, reward: torch.Tensor, steps: torch.Tensor, done: torch.Tensor, success: torch.Tensor
    ) -> None:
        self.returns += reward.sum(-1).cpu()
        self.lengths += steps.cpu()
        for i in done.cpu().nonzero().flatten().tolist():
            self.finished.append((float(self.returns[i]), int(self.lengths[i]), bool(success[i])))
            self.returns[i], self.lengths[i] = 0.0, 0

    def discard_running(self) -> None:
        """Forget episodes in progress (their envs are being reset, so they never finish)."""
        self.returns.zero_()
        self.lengths.zero_()

    def pop(self) -> dict[str, float]:
        """Mean return, length and success of the finished episodes, then forget them."""
        if not self.finished:
            return {"episodes": 0.0}
        returns, lengths, successes = zip(*self.finished, strict=True)
        self.finished = []
        n = len(returns)
        return {
            "episodes": float(n),
            "return": sum(returns) / n,
            "length": sum(lengths) / n,
            "success": sum(successes) / n,
        }


class SequentialCollector:
    """Fills a RolloutBuffer with T decisions of every env, timing each stage."""

    def __init__(self, env: VecEnv, policy: torch.nn.Module, buffer: RolloutBuffer) -> None:
        self.env, self.policy, self.buffer = env, policy, buffer
        self.tracker = EpisodeTracker.zeros(env.num_envs)

    def collect(self, obs: TensorDict) -> tuple[TensorDict, dict[str, float]]:
        """Run T decisions from `obs`; returns the next observation and stage timings (seconds)."""
        timings = {"inference": 0.0, "env_step": 0.0}
        self.buffer.clear()
        self.policy.eval()
        for _ in range(self.buffer.num_steps):
            t0 = time.perf_counter()
            out = self.policy.act(obs)
            t1 = time.perf_counter()
            res = self.env.step(out.actions)
            t2 = time.perf_counter()
            bootstrap = torch.zeros_like(out.value)
            if res.truncated.any():  # time limit: the return continues past the cut, bootstrap V(final_obs)
                with torch.no_grad():
                    bootstrap[res.truncated] = self.policy.value(res.final_obs[res.truncated])
            self.buffer.add(
                TensorDict(
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
                        "bootstrap_value": bootstrap,
                    },
                    batch_size=[self.env.num_envs],
                )
            )
            self.tracker.record(res.reward, res.steps_executed, res.done, res.success)
            obs = res.obs
            timings["inference"] += t1 - t0 + time.perf_counter() - t2
            timings["env_step"] += t2 - t1
        with torch.no_grad():
            self.buffer.set_last_value(self.policy.value(obs))
        self.policy.train()
        return obs, timings
