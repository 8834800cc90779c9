"""Observation key names: the one vocabulary that simulators, policies, the engine and deploy share.

An observation is a TensorDict [N] holding some of these keys (an absent key is simply absent):
    rgb          uint8   [N, H, W, 3]  main camera
    wrist_rgb    uint8   [N, H, W, 3]  wrist camera
    state        float32 [N, S]        proprioception
    privileged   float32 [N, P]        sim-only state (object poses), for critics
    task_id      int64   [N]           index into the env's instruction table
Language policies also read `instruction` (N strings), which they look up from `task_id` themselves;
a served policy receives it in the request instead.
"""

from __future__ import annotations

RGB, WRIST_RGB, STATE, PRIVILEGED, TASK_ID = "rgb", "wrist_rgb", "state", "privileged", "task_id"
INSTRUCTION = "instruction"

OBS_KEYS = (RGB, WRIST_RGB, STATE, PRIVILEGED, TASK_ID)
IMAGE_KEYS = (RGB, WRIST_RGB)
VECTOR_KEYS = (STATE, PRIVILEGED)  # float vectors, normalized by every policy family


def key_dtype(key: str) -> str:
    """The dtype name of one observation key's values: "uint8", "int64" or "float32"."""
    return "uint8" if key in IMAGE_KEYS else "int64" if key == TASK_ID else "float32"
