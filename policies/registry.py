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

ADAPTER_CONFIG_FILE = "adapter_config.json"  # marks a LoRA checkpoint (policies/lora.py)
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


def load_policy(directory: str | Path, device: str = "cpu", merge_adapters: bool = True) -> Policy:
    """Load any family's checkpoint folder; config.json's "family" picks the class. A LoRA checkpoint comes
    back with its adapters merged into the weights (a plain policy), or with merge_adapters=False injected
    and trainable, as it was saved (to resume training)."""
    if not (Path(directory) / ADAPTER_CONFIG_FILE).is_file():
        return load_base_policy(directory, device)
    from embodrl.policies.lora import load_lora_checkpoint, merge_lora

    policy, _ = load_lora_checkpoint(directory, device)
    return merge_lora(policy) if merge_adapters else policy


def load_base_policy(directory: str | Path, device: str = "cpu") -> Policy:
    """The checkpoint's model.safetensors alone (of a LoRA checkpoint: the base weights, adapters ignored)."""
    from embodrl.policies.checkpoint import CONFIG_FILE, not_a_checkpoint

    config_path = Path(directory) / CONFIG_FILE
    if not config_path.is_file():
        raise not_a_checkpoint(directory)
    family = json.loads(config_path.read_text()).get("family")
    return policy_class(family).from_pretrained(directory, device=device)
