"""Checkpoint folders shared by the families: config.json, model.safetensors, normalization.safetensors.

A family class mixes this in and provides `family` (its registry name), `cfg` (PolicyConfig),
`obs_shapes` and `normalizers` (an nn.ModuleDict of Normalizer), and takes
`(cfg, obs_shapes, device)` in its constructor.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from embodrl.errors import UserError
from embodrl.policies.config import PolicyConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
NORMALIZATION_FILE = "normalization.safetensors"
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
            "load it with embodrl.policies.registry.load_policy"
        )
    shapes = {key: tuple(shape) for key, shape in data["obs_shapes"].items()}
    return PolicyConfig.from_dict(data["policy"]), shapes


class CheckpointMixin:
    """`save_pretrained` / `from_pretrained` / `set_normalization` for any family."""

    family: str

    @property
    def device(self) -> torch.device:
        return self.normalizers["action"].mean.device

    def set_normalization(self, stats: Mapping[str, Mapping]) -> None:
        """Set stats per key ("state", "privileged", "action": {mean, std, q01, q99}); others are ignored."""
        for key, key_stats in stats.items():
            if key in self.normalizers:
                self.normalizers[key].set_stats(key_stats)

    def set_instruction_table(self, instructions: Sequence[str]) -> None:
        """The env's instruction table (policy.vla.instructions), through which a language policy reads its
        prompt by obs["task_id"]; an imported checkpoint comes without one."""
        self.cfg = dataclasses.replace(
            self.cfg, vla=dataclasses.replace(self.cfg.vla, instructions=tuple(instructions))
        )

    def save_pretrained(self, directory: str | Path) -> None:
        """Write config.json, model.safetensors and normalization.safetensors into `directory`."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = {
            "family": self.family,
            "policy": self.cfg.to_dict(),
            "obs_shapes": {key: list(shape) for key, shape in self.obs_shapes.items()},
        }
        (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        state = {key: value.detach().cpu().contiguous() for key, value in self.state_dict().items()}
        norm = {k.removeprefix(NORM_PREFIX): v for k, v in state.items() if k.startswith(NORM_PREFIX)}
        weights = {k: v for k, v in state.items() if not k.startswith(NORM_PREFIX)}
        save_file(weights, str(directory / WEIGHTS_FILE))
        save_file(norm, str(directory / NORMALIZATION_FILE))

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str = "cpu"):
        """Rebuild the policy saved in `directory` on `device`."""
        cfg, obs_shapes = read_config(directory, cls.family)
        policy = cls(cfg, obs_shapes, device=device)
        state = load_file(str(Path(directory) / WEIGHTS_FILE), device=str(device))
        norm = load_file(str(Path(directory) / NORMALIZATION_FILE), device=str(device))
        state.update({NORM_PREFIX + key: value for key, value in norm.items()})
        policy.load_state_dict(state)
        return policy
