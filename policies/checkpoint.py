"""The checkpoint folder every family writes: config.json, model.safetensors, normalization.safetensors.

A LoRA checkpoint adds adapter_config.json and adapter_model.safetensors (policies/lora.py); the
loaders that pick a family's class from config.json are in policies/loading.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from embodrl.errors import UserError
from embodrl.policies.config import PolicyConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
NORMALIZATION_FILE = "normalization.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"  # marks a LoRA checkpoint
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
NORM_PREFIX = "normalizers."


def not_a_checkpoint(directory: str | Path) -> UserError:
    """The error for a folder without config.json, pointing at the policies inside a run folder (or its
    checkpoints/<name>/), the folders users most often pass instead."""
    directory = Path(directory)
    inside = [
        path.parent
        for pattern in (
            f"checkpoints/*/policy/{CONFIG_FILE}",
            f"*/policy/{CONFIG_FILE}",
            f"policy/{CONFIG_FILE}",
        )
        for path in sorted(directory.glob(pattern))
    ]
    hint = f"; did you mean {' or '.join(str(path) for path in inside)}?" if inside else ""
    return UserError(f"{directory} is not a policy checkpoint: {CONFIG_FILE} is missing{hint}")


def read_config(directory: str | Path, family: str) -> tuple[PolicyConfig, dict[str, tuple[int, ...]]]:
    """The PolicyConfig and observation shapes of a checkpoint, checking it belongs to `family`."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise not_a_checkpoint(directory)
    data = json.loads(path.read_text())
    if data.get("family") != family:
        raise UserError(
            f"{directory} holds a {data.get('family')!r} policy, not {family!r}; "
            "load it with embodrl.policies.loading.load_policy"
        )
    shapes = {key: tuple(shape) for key, shape in data["obs_shapes"].items()}
    return PolicyConfig.from_dict(data["policy"]), shapes


def write_checkpoint(
    directory: str | Path,
    family: str,
    cfg: PolicyConfig,
    obs_shapes: Mapping[str, tuple[int, ...]],
    state_dict: Mapping[str, torch.Tensor],
) -> None:
    """Write config.json, model.safetensors and normalization.safetensors into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "family": family,
        "policy": cfg.to_dict(),
        "obs_shapes": {key: list(shape) for key, shape in obs_shapes.items()},
    }
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    state = {key: value.detach().cpu().contiguous() for key, value in state_dict.items()}
    norm = {k.removeprefix(NORM_PREFIX): v for k, v in state.items() if k.startswith(NORM_PREFIX)}
    weights = {k: v for k, v in state.items() if not k.startswith(NORM_PREFIX)}
    save_file(weights, str(directory / WEIGHTS_FILE))
    save_file(norm, str(directory / NORMALIZATION_FILE))


def read_checkpoint(
    directory: str | Path, family: str, device: str = "cpu"
) -> tuple[PolicyConfig, dict[str, tuple[int, ...]], dict[str, torch.Tensor]]:
    """The config, observation shapes and whole state dict (normalizers included) of a `family` checkpoint."""
    cfg, obs_shapes = read_config(directory, family)
    state = load_file(str(Path(directory) / WEIGHTS_FILE), device=str(device))
    norm = load_file(str(Path(directory) / NORMALIZATION_FILE), device=str(device))
    state.update({NORM_PREFIX + key: value for key, value in norm.items()})
    return cfg, obs_shapes, state


def checkpoint_family(directory: str | Path) -> str:
    """The family name a checkpoint folder's config.json records."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise not_a_checkpoint(directory)
    return json.loads(path.read_text()).get("family")
