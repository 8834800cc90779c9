"""ManiSkill3 adapter (`maniskill` extra): GPU-batched on CUDA, one CPU sim per env otherwise."""

from embodrl.sims.maniskill.env import ManiSkillVecEnv, make_maniskill

__all__ = ["ManiSkillVecEnv", "make_maniskill"]
