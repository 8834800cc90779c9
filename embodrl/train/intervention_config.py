"""The `intervention` config group (torch-free): when a scripted expert takes over from the policy."""

from __future__ import annotations

from dataclasses import dataclass

from embodrl.choices import check_choice, check_positive

INTERVENERS = ("none", "expert")


@dataclass
class InterventionConfig:
    """Simulated human interventions in off-policy training (HIL-SERL, HG-DAgger): with `mode=expert` the
    env's scripted expert drives an env once the policy strays from it, and its steps join the demos."""

    mode: str = "none"  # INTERVENERS; expert: the env's scripted expert (VecEnv.expert_actions)
    # a decision strays when the mean |policy action - expert action| over the action's elements exceeds
    # this (env units; the tabletop's actions lie in [-1, 1])
    threshold: float = 0.5
    patience: int = 3  # consecutive straying decisions before the expert takes over
    steps: int = 10  # decisions the expert then drives before it hands back

    def __post_init__(self) -> None:
        check_choice("intervention.mode", self.mode, INTERVENERS)
        check_positive("intervention.threshold", self.threshold)
        check_positive("intervention.patience", self.patience)
        check_positive("intervention.steps", self.steps)
