"""Policy families by name, imported lazily so heavy backends cost nothing until used.

Adding a family: one `FAMILIES` line in config.py ("name": "module:Class") beside its nested config
field, and a `Policy` subclass (policies/base.py) whose `family` is that name. Loading a saved
checkpoint, which picks the class from its config.json, is in loading.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from embodrl.errors import UserError
from embodrl.policies.config import FAMILIES, PolicyConfig

if TYPE_CHECKING:
    from embodrl.policies.base import Policy


def policy_class(family: str) -> type[Policy]:
    """The Policy class registered under `family`."""
    if family not in FAMILIES:
        raise UserError(f"unknown policy family {family!r}; valid families: {', '.join(FAMILIES)}")
    module, name = FAMILIES[family].split(":")
    return getattr(importlib.import_module(module), name)


def obs_shapes_from_spec(obs_spec: Mapping) -> dict[str, tuple[int, ...]]:
    """Per-env shapes from an env's `observation_spec` (values with `.shape`) or plain shape tuples."""
    return {key: tuple(getattr(spec, "shape", spec)) for key, spec in obs_spec.items()}


def make_policy(cfg: PolicyConfig, obs_spec: Mapping, device: str = "cpu") -> Policy:
    """Build a fresh policy of family `cfg.family` for observations shaped like `obs_spec`."""
    return policy_class(cfg.family)(cfg, obs_shapes_from_spec(obs_spec), device=device)
