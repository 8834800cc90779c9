"""The `intervention` config group (torch-free): when a scripted expert takes over from the policy."""

from __future__ import annotations

from dataclasses import dataclass

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError

INTERVENERS = ("none", "expert")
TRIGGERS = ("deviation", "stall")


@dataclass
class InterventionConfig:
    """Simulated human interventions in off-policy training (HIL-SERL, HG-DAgger): with `mode=expert` the
    env's scripted expert drives an env once the policy strays from it, and its steps join the demos."""

    mode: str = "none"  # INTERVENERS; expert: the env's scripted expert (VecEnv.expert_actions)
    # TRIGGERS: what counts against the policy. deviation: its action differs from the expert's;
    # stall: the task's progress (VecEnv.task_progress) did not rise since the policy's last headway
    trigger: str = "deviation"
    # deviation: a decision strays when the mean |policy action - expert action| over the action's
    # elements exceeds this (env units; the tabletop's actions lie in [-1, 1])
    threshold: float = 0.5
    # stall: headway is progress (in [0, 1]) above the last headway's level by more than this
    min_progress: float = 0.005
    patience: int = 3  # consecutive decisions against the policy before the expert takes over
    steps: int = 10  # decisions the expert then drives before it hands back
    # A watcher who trusts the robot more as training goes on: patience grows linearly from `patience` to
    # `patience_final` over the first `trust_steps` env steps (0: patience stays where it starts)
    patience_final: int = 0
    trust_steps: int = 0

    def __post_init__(self) -> None:
        check_choice("intervention.mode", self.mode, INTERVENERS)
        check_choice("intervention.trigger", self.trigger, TRIGGERS)
        check_positive("intervention.threshold", self.threshold)
        check_positive("intervention.min_progress", self.min_progress)
        check_positive("intervention.patience", self.patience)
        check_positive("intervention.steps", self.steps)
        check_positive("intervention.patience_final", self.patience_final, allow_zero=True)
        check_positive("intervention.trust_steps", self.trust_steps, allow_zero=True)
        if bool(self.patience_final) != bool(self.trust_steps):
            raise ConfigError(
                "intervention.patience_final and intervention.trust_steps go together: set both (patience "
                "grows to patience_final over trust_steps env steps) or neither"
            )
