"""Training checkpoints: the policy (save_pretrained) plus optimizer, RNG and loop state, atomically."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from embodrl.errors import UserError
from embodrl.policies.loading import load_policy
from embodrl.policies.lora import save_policy

LAST = "checkpoints/last"  # a run folder's latest checkpoint, which --resume continues from
POLICY_DIR = "policy"
STATE_FILE = "trainer_state.pt"
INFO_FILE = "info.json"


def save_checkpoint(
    directory: Path, policy, trainer_state: dict | None = None, info: dict | None = None
) -> Path:
    """Write `directory` (policy/, trainer_state.pt to resume from, info.json to read) through a temporary
    folder: never half a checkpoint."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_policy(policy, tmp / POLICY_DIR)  # with LoRA: base weights + adapters (policies/lora.py)
    if trainer_state is not None:
        torch.save(trainer_state, tmp / STATE_FILE)
    if info is not None:
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2))
    old = directory.with_name(directory.name + ".old")
    if directory.exists():
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def load_trainer_state(directory: Path) -> dict:
    """The loop state saved next to the policy; raises a UserError when the folder is not a checkpoint."""
    path = directory / STATE_FILE
    if not path.is_file():
        raise UserError(f"{directory} is not a training checkpoint ({STATE_FILE} is missing)")
    return torch.load(path, weights_only=False)


def restore_checkpoint(
    directory: Path,
    policy,
    device: str,
    generators: dict[str, torch.Generator],
    load_weights: Callable[[dict[str, torch.Tensor]], None] | None = None,
) -> dict:
    """Load the weights and RNG states saved in `directory` into `policy` and `generators`; return the
    trainer state for the runner's own fields (optimizer, counters).

    load_weights: how the saved weights enter the policy (FSDP: re-sharded); policy.load_state_dict if None.
    """
    state = load_trainer_state(directory)
    # LoRA adapters stay separate, so the policy keeps training them
    saved = load_policy(directory / POLICY_DIR, device=device, merge_adapters=False)
    (load_weights or policy.load_state_dict)(saved.state_dict())
    set_rng_state(state["rng"], generators)
    return state


def rng_state(generators: dict[str, torch.Generator]) -> dict:
    return {"torch": torch.get_rng_state(), **{name: g.get_state() for name, g in generators.items()}}


def set_rng_state(state: dict, generators: dict[str, torch.Generator]) -> None:
    torch.set_rng_state(state["torch"])
    for name, g in generators.items():
        g.set_state(state[name])
