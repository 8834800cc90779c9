"""Simulators behind the VecEnv contract."""

import os
import sys

# Headless Linux (servers, CI): render offscreen through EGL (Mesa llvmpipe on CPU, the driver on GPU).
# Must happen before mujoco is first imported; a user's own MUJOCO_GL always wins.
if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
