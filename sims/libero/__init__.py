"""LIBERO adapter (`libero` extra, in its own venv: LIBERO pins mujoco<4)."""

from embodrl.sims.libero.env import LiberoVecEnv, make_libero

__all__ = ["LiberoVecEnv", "make_libero"]
