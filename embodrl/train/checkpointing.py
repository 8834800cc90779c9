"""Training checkpoints: the policy (save_pretrained) plus optimizer, RNG and loop state, atomically.

A save writes `<name>.tmp/` with a manifest of every file's size and SHA-256 written last, then swaps it
in: `<name>` -> `<name>.old`, `<name>.tmp` -> `<name>`, `<name>.old` removed. A kill at any point leaves a
complete checkpoint in one of the three folders; `recover_checkpoint` (run before every save and resume)
puts the newest complete one back at `<name>` and removes the rest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
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
MANIFEST_FILE = "manifest.json"

log = logging.getLogger(__name__)


def file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(directory: Path) -> None:
    """Record every file of `directory` (size, SHA-256) in its manifest, written last and atomically: a
    folder with a manifest was written completely."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    entries = {
        str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": file_digest(p)} for p in files
    }
    tmp = directory / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(entries, indent=1))
    tmp.rename(directory / MANIFEST_FILE)


def checkpoint_problem(directory: Path) -> str | None:
    """Why `directory` is not a complete checkpoint, or None when it is: its manifest is missing or a
    listed file is missing or differs."""
    manifest = directory / MANIFEST_FILE
    if not manifest.is_file():
        return f"{MANIFEST_FILE} is missing (the save was interrupted)"
    try:
        entries = json.loads(manifest.read_text())
    except (OSError, ValueError) as error:
        return f"{MANIFEST_FILE} is unreadable ({error})"
    for name, entry in entries.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != entry["bytes"] or file_digest(path) != entry["sha256"]:
            return f"{name} differs from its checksum"
    return None


def recover_checkpoint(directory: Path) -> None:
    """Leave `directory` as the newest complete checkpoint among it and the `.tmp` / `.old` folders an
    interrupted save left beside it, and remove those. A `directory` from before manifests (its swap was
    atomic) counts as complete; nothing happens when there is nothing to recover."""
    tmp = directory.with_name(directory.name + ".tmp")
    old = directory.with_name(directory.name + ".old")
    if not tmp.exists() and not old.exists():
        return
    current_ok = directory.is_dir() and (
        not (directory / MANIFEST_FILE).exists() or checkpoint_problem(directory) is None
    )
    if not current_ok:
        for candidate in (tmp, old):  # .tmp is newer than .old
            if candidate.is_dir() and checkpoint_problem(candidate) is None:
                if directory.exists():
                    shutil.rmtree(directory)
                candidate.rename(directory)
                log.warning(
                    "%s: an interrupted save left it incomplete; recovered it from %s",
                    directory,
                    candidate.name,
                )
                break
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover)
            log.warning("%s: removed %s, left by an interrupted save", directory, leftover.name)


def save_checkpoint(
    directory: Path, policy, trainer_state: dict | None = None, info: dict | None = None
) -> Path:
    """Write `directory` (policy/, trainer_state.pt to resume from, info.json to read) through a temporary
    folder: never half a checkpoint."""
    recover_checkpoint(directory)
    tmp = directory.with_name(directory.name + ".tmp")
    tmp.mkdir(parents=True)
    save_policy(policy, tmp / POLICY_DIR)  # with LoRA: base weights + adapters (policies/lora.py)
    if trainer_state is not None:
        torch.save(trainer_state, tmp / STATE_FILE)
    if info is not None:
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2))
    write_manifest(tmp)
    old = directory.with_name(directory.name + ".old")
    if directory.exists():
        directory.rename(old)
        tmp.rename(directory)
        shutil.rmtree(old)
    else:
        tmp.rename(directory)
    return directory


def link_or_copy(source: str, target: str) -> None:
    """A hard link (no extra disk), or a copy where the filesystem has none."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def keep_copy(directory: Path, number: int, keep: int) -> None:
    """Keep checkpoint `directory` also as `<its parent>/<number>/` (hard links), and only the `keep` highest
    numbered such copies."""
    if keep <= 0:
        return
    copy = directory.parent / str(number)
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(directory, copy, copy_function=link_or_copy)
    numbered = sorted((p for p in directory.parent.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    for old in numbered[:-keep]:
        shutil.rmtree(old)


def load_trainer_state(directory: Path) -> dict:
    """The loop state saved next to the policy (tensors and plain values only: a run folder from elsewhere
    cannot run code); raises a UserError when the folder is not a complete checkpoint."""
    recover_checkpoint(directory)
    path = directory / STATE_FILE
    if not path.is_file():
        raise UserError(f"{directory} is not a training checkpoint ({STATE_FILE} is missing)")
    if (directory / MANIFEST_FILE).exists():
        problem = checkpoint_problem(directory)
        if problem:
            raise UserError(f"{directory} is damaged: {problem}")
    return torch.load(path, weights_only=True)


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
