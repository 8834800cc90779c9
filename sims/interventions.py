"""Simulated human interventions (HIL-SERL, HG-DAgger): the env's scripted expert takes over an env once
the learning policy strays or stalls, drives a few decisions, and hands back.

The rule (`intervention.*`, train/intervention_config.py) counts decisions that go against the policy, by
`trigger`: `deviation`, the mean |policy action - expert action| over the action's elements exceeds
`threshold` (a strict teacher: a different route that also works counts against the policy); `stall`, the
task's progress (VecEnv.task_progress) has not risen by more than `min_progress` above its level at the
policy's last headway (a watcher who steps in when the robot gets nowhere). After `patience` such
decisions in a row the expert drives the next `steps` decisions of that env (the decision that tripped the
rule included); with `patience_final`, the patience grows to it over the first `trust_steps` env steps (a
person who steps in less as the robot earns trust). A takeover ends early with its episode. The off-policy
runner, or a simulated actor of `embodrl learner`, flags the expert's decisions; the learner keeps them in
the demo buffer besides the online one, and logs the share of decisions the expert drove as
`rollout/intervention_rate`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from embodrl.errors import UserError


class TakeoverRule(Protocol):
    """When the expert takes over (InterventionConfig has these fields)."""

    mode: str
    trigger: str
    threshold: float
    min_progress: float
    patience: int
    steps: int
    patience_final: int
    trust_steps: int


class ExpertEnv(Protocol):
    """What the intervener reads of the env (VecEnv has both)."""

    def expert_actions(self) -> torch.Tensor: ...

    def task_progress(self) -> torch.Tensor: ...


class ScriptedIntervener:
    """Per-env takeover state for `num_envs` envs; `choose` picks each decision's driver."""

    def __init__(self, cfg: TakeoverRule, num_envs: int, chunk_size: int) -> None:
        if chunk_size != 1:
            raise UserError(
                f"intervention.mode={cfg.mode} hands single expert actions over; policy.chunk_size="
                f"{chunk_size} would need chunks: set policy.chunk_size=1"
            )
        self.cfg = cfg
        self.patience = cfg.patience
        self.straying = torch.zeros(num_envs, dtype=torch.long)  # consecutive decisions against the policy
        self.remaining = torch.zeros(num_envs, dtype=torch.long)  # decisions the expert still drives
        self.headway = torch.full((num_envs,), -torch.inf)  # stall: the progress the policy last rose to
        self.decisions = self.driven = self.takeovers = 0

    def trust(self, env_steps: int) -> int:
        """Set and return the patience after `env_steps` env steps of training (`patience_final` ramp)."""
        if self.cfg.patience_final:
            grown = min(env_steps / self.cfg.trust_steps, 1.0)
            self.patience = round(self.cfg.patience + (self.cfg.patience_final - self.cfg.patience) * grown)
        return self.patience

    def choose(self, policy_actions: torch.Tensor, env: ExpertEnv) -> tuple[torch.Tensor, torch.Tensor]:
        """The executed chunks [N, 1, A] and which of them the expert drove [N] (bool), from the policy's
        chunks [N, 1, A] and the env's expert actions [N, A] (and task progress [N] for `stall`)."""
        expert = env.expert_actions().to(policy_actions).view_as(policy_actions)
        free = self.remaining == 0
        if self.cfg.trigger == "stall":
            against = self._stalled(env.task_progress().float().cpu(), free)
        else:
            against = (policy_actions - expert).abs().flatten(1).mean(1).cpu() > self.cfg.threshold
        self.straying = torch.where(free & against, self.straying + 1, torch.zeros_like(self.straying))
        takeover = free & (self.straying >= self.patience)
        self.remaining[takeover] = self.cfg.steps
        self.straying[takeover] = 0
        driven = self.remaining > 0
        self.remaining = (self.remaining - 1).clamp_min(0)
        self.decisions += len(driven)
        self.driven += int(driven.sum())
        self.takeovers += int(takeover.sum())
        mask = driven.to(policy_actions.device)
        return torch.where(mask.view(-1, 1, 1), expert, policy_actions), mask

    def _stalled(self, progress: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
        """[N] bool: the policy made no headway (progress not above its last headway + min_progress); while
        the expert drives, its progress becomes the level the policy starts from."""
        headway = progress > self.headway + self.cfg.min_progress
        self.headway = torch.where(headway | ~free, progress, self.headway)
        return ~headway

    def end_episodes(self, done: torch.Tensor) -> None:
        """Envs whose episode ended start their next one with the policy in control."""
        done = done.cpu()
        self.straying[done], self.remaining[done] = 0, 0
        self.headway[done] = -torch.inf

    def pop_metrics(self, episodes: float) -> dict[str, float]:
        """Since the last call: the share of decisions the expert drove and its takeovers per episode."""
        metrics = {
            "rollout/intervention_rate": self.driven / max(self.decisions, 1),
            "rollout/interventions_per_episode": self.takeovers / max(episodes, 1.0),
        }
        self.decisions = self.driven = self.takeovers = 0
        return metrics
