"""Tensors <-> the numpy arrays the remote protocol carries (nested maps of either)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict


def to_arrays(tree: Mapping[str, Any] | TensorDict) -> dict[str, Any]:
    """A (nested) map or TensorDict of tensors as numpy arrays on the CPU; bfloat16 travels as float32
    (numpy has no bfloat16; load_state_dict casts it back)."""
    if isinstance(tree, TensorDict):
        tree = tree.to_dict()
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out[key] = to_arrays(value)
        else:
            value = value.detach().cpu()
            out[key] = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    return out


def to_tensors(tree: Mapping[str, Any], device: str | torch.device = "cpu") -> dict[str, Any]:
    """A nested map of numpy arrays as tensors on `device` (copies: received arrays are read-only)."""
    return {
        key: to_tensors(value, device)
        if isinstance(value, Mapping)
        else torch.tensor(np.asarray(value), device=device)
        for key, value in tree.items()
    }
