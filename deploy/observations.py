"""Server-side request checks: request keys -> embodrl observation keys, dtypes, shapes, image resize.

Every failure raises RequestError with a message meant for the client (it becomes the error reply).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from embodrl.deploy.config import ObservationKeys
from embodrl.deploy.runner import InputSpec
from embodrl.obs_keys import IMAGE_KEYS

MAX_PROMPT_CHARS = 4096


class RequestError(ValueError):
    """A request the server cannot serve; the message goes back to the client."""


def resize_with_pad(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 [H, W, 3] -> [height, width, 3], keeping aspect ratio, padding with black (as openpi)."""
    h, w = image.shape[:2]
    if (h, w) == (height, width):
        return image
    scale = min(height / h, width / w)
    new_h, new_w = max(1, round(h * scale)), max(1, round(w * scale))
    resized = np.asarray(Image.fromarray(np.ascontiguousarray(image)).resize((new_w, new_h), Image.BILINEAR))
    out = np.zeros((height, width, 3), dtype=np.uint8)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    out[top : top + new_h, left : left + new_w] = resized
    return out


def _image(value: Any, name: str, spec: InputSpec) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim != 3 or value.shape[2] != 3:
        got = f"{value.dtype} {list(value.shape)}" if isinstance(value, np.ndarray) else type(value).__name__
        raise RequestError(f"{name!r} must be a uint8 image [H, W, 3] (HWC, RGB); got {got}")
    if min(value.shape[:2]) == 0:
        raise RequestError(f"{name!r} is an empty image {list(value.shape)}")
    return resize_with_pad(value, spec.shape[0], spec.shape[1])


def _numeric(value: Any, name: str) -> np.ndarray:
    array = np.asarray(value) if isinstance(value, np.ndarray | np.generic | int | float) else None
    if array is None or array.dtype.kind not in "biuf":
        raise RequestError(f"{name!r} must be a numeric array; got {type(value).__name__}")
    array = array.astype(np.float32).reshape(-1)
    if not np.all(np.isfinite(array)):
        raise RequestError(f"{name!r} holds NaN or inf")
    return array


def _state(request: dict, names: tuple[str, ...], spec: InputSpec) -> np.ndarray:
    state = np.concatenate([_numeric(request[name], name) for name in names])
    if state.shape != spec.shape:
        raise RequestError(
            f"state from {list(names)} has {state.shape[0]} values; the policy expects {spec.shape[0]}"
        )
    return state


def _prompt(value: Any, name: str) -> str:
    if isinstance(value, np.ndarray) and value.dtype.kind == "U" and value.shape == ():
        value = str(value)
    if not isinstance(value, str):
        raise RequestError(f"{name!r} must be a string; got {type(value).__name__}")
    if len(value) > MAX_PROMPT_CHARS:
        raise RequestError(f"{name!r} is longer than {MAX_PROMPT_CHARS} characters")
    return value


def _task_id(value: Any, name: str) -> np.ndarray:
    array = np.asarray(value) if isinstance(value, np.ndarray | np.generic | int) else None
    if array is None or array.dtype.kind not in "iu" or array.size != 1:
        raise RequestError(f"{name!r} must be one integer; got {type(value).__name__}")
    return array.reshape(()).astype(np.int64)


def to_observation(request: Any, keys: ObservationKeys, spec: dict[str, InputSpec]) -> dict[str, Any]:
    """A decoded request map -> the runner's observation dict, or RequestError saying what is wrong."""
    if not isinstance(request, dict):
        raise RequestError(f"a request must be a msgpack map of observations; got {type(request).__name__}")
    sources = {
        "rgb": (keys.image,),
        "wrist_rgb": (keys.wrist_image,),
        "state": keys.state,
        "instruction": (keys.prompt,),
        "task_id": (keys.task_id,),
    }
    obs: dict[str, Any] = {}
    for key, key_spec in spec.items():
        if key not in sources:
            raise RequestError(f"the policy reads {key!r}, which no request key maps to")
        names = sources[key]
        missing = [name for name in names if name not in request]
        if missing:
            if key_spec.optional:
                continue
            raise RequestError(
                f"request lacks {missing} (the policy's {key!r} input); it has {sorted(map(str, request))}"
            )
        if key in IMAGE_KEYS:
            obs[key] = _image(request[names[0]], names[0], key_spec)
        elif key == "state":
            obs[key] = _state(request, names, key_spec)
        elif key == "instruction":
            obs[key] = _prompt(request[names[0]], names[0])
        else:
            obs[key] = _task_id(request[names[0]], names[0])
    return obs
