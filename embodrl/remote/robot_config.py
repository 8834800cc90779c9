"""The settings of a robot actor (`embodrl actor --robot`), torch-free: the robot side reads them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from embodrl.choices import check_positive
from embodrl.deploy.config import ChunkConfig, ResetConfig, RobotLoopConfig, SafetyConfig
from embodrl.errors import ConfigError

KINDS_WITH_A_WORKSPACE = ("sim",)  # robots whose end-effector box for learning is known (sim_robot.py)


@dataclass
class RobotActorConfig(RobotLoopConfig):
    """`embodrl deploy`'s robot loop (robot.*, safety.*, teleop.*, keys.*, fps, max_steps, prompt, record_dir)
    driven by the learner's policy, plus what learning on hardware needs: the end-effector workspace box on
    by default, and a reset between episodes. The chunk is the learner's policy's (one action a decision)."""

    # a decision is one action: the rate limit (safety.max_relative_target) bounds its step from the last
    # one, where rejecting a chunk that jumps (max_chunk_jump) would hold the arm instead of exploring
    safety: SafetyConfig = field(default_factory=lambda: SafetyConfig(max_chunk_jump=None))
    episodes: int = 0  # episodes to play; 0: until the learner finishes its run
    # keep the end effector in safety.workspace_low/high (the sim stand-in has a default box); false: learn
    # without a box (not recommended on hardware)
    workspace_box: bool = True
    reset: ResetConfig = field(default_factory=ResetConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("episodes", self.episodes, allow_zero=True)
        if self.chunk != ChunkConfig():
            raise ConfigError("chunk.* is the learner's policy's in `embodrl actor --robot`; leave it unset")
        box_set = self.safety.workspace_low is not None
        if self.workspace_box and not box_set and self.robot.kind not in KINDS_WITH_A_WORKSPACE:
            raise ConfigError(
                f"robot.kind={self.robot.kind} has no known end-effector box for learning: set "
                "safety.workspace_low=[x,y,z] and safety.workspace_high=[x,y,z] (m, the frame of "
                "safety.ee_position_features), or workspace_box=false to learn without one"
            )


def learning_loop(cfg: RobotActorConfig) -> RobotLoopConfig:
    """The control loop's settings for learning: one action a decision, and `cfg.safety` with the end-effector
    box a learning robot keeps to: as set, else the robot's default (the sim stand-in's, around its table),
    none only with workspace_box=false."""
    safety = cfg.safety
    if safety.workspace_low is None and cfg.workspace_box:
        from embodrl.deploy.sim_robot import LEARNING_WORKSPACE  # the one default (KINDS_WITH_A_WORKSPACE)

        low, high = LEARNING_WORKSPACE
        safety = dataclasses.replace(safety, workspace_low=low, workspace_high=high)
    loop_fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(RobotLoopConfig)}
    one_action = ChunkConfig(action_horizon=1, execute_steps=1)
    return RobotLoopConfig(**{**loop_fields, "safety": safety, "chunk": one_action})
