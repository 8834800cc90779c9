"""The embedded MuJoCo tabletop suite (MJCF generated in Python, scripted experts, batched physics).

Import-light: nothing here imports mujoco. Importing any submodule first picks a headless GL
backend (EGL, else OSMesa) unless MUJOCO_GL is already set, because mujoco reads it at import.
"""

from __future__ import annotations

import ctypes.util
import os


def _default_gl_backend() -> None:
    if "MUJOCO_GL" in os.environ:
        return
    backend = "egl" if ctypes.util.find_library("EGL") or not ctypes.util.find_library("OSMesa") else "osmesa"
    os.environ["MUJOCO_GL"] = backend
    os.environ.setdefault("PYOPENGL_PLATFORM", backend)


_default_gl_backend()


def describe() -> dict[str, dict[str, list[str]]]:
    """Suite -> task -> example instructions, for `embodrl envs`."""
    from embodrl.sims.tabletop.tasks import SUITES, instruction_entries

    out: dict[str, dict[str, list[str]]] = {}
    for suite in SUITES.values():
        entries = instruction_entries(suite.tasks)
        texts = {t: [e.text for e in entries if e.task == t] for t in suite.tasks}
        # three examples spread over the templates and colours
        out[suite.name] = {t: v[:: max(1, len(v) // 3)][:3] for t, v in texts.items()}
    return out
