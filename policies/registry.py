"""Policy families by name, imported lazily so heavy backends cost nothing until used.

Adding a family: one `FAMILIES` line here ("name": "module:Class") and its nested config field in
config.py. Every class takes `(cfg: PolicyConfig, obs_shapes: dict[str, tuple[int, ...]], device)`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from embodrl.errors import UserError

if TYPE_CHECKING:
    from embodrl.policies.base import Policy
    from embodrl.policies.config import PolicyConfig

# family name -> "module:Class"
FAMILIES: dict[str, str] = {
    "gaussian": "embodrl.policies.gaussian.modeling:GaussianPolicy",
    "flow": "embodrl.policies.flow.modeling:FlowPolicy",
    "autoregressive": "embodrl.policies.autoregressive.modeling:AutoregressivePolicy",
    "diffusion": "embodrl.policies.diffusion.modeling:DiffusionPolicy",
}


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


def load_policy(directory: str | Path, device: str = "cpu") -> Policy:
    """Load any family's checkpoint folder; config.json's "family" picks the class."""
    config_path = Path(directory) / "config.json"
    if not config_path.is_file():
        raise UserError(f"{directory} is not a policy checkpoint: {config_path.name} is missing")
    family = json.loads(config_path.read_text()).get("family")
    return policy_class(family).from_pretrained(directory, device=device)
