"""Suites by name, imported lazily so optional backends cost nothing until used."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from embodrl.errors import UserError
from embodrl.sims.config import NO_SIMULATOR, EnvConfig

if TYPE_CHECKING:
    from embodrl.sims.base import VecEnv

# suite name -> "module:factory"; each factory takes an EnvConfig and returns a VecEnv.
SUITES: dict[str, str] = {
    "tabletop-basic": "embodrl.sims.tabletop.env:make_tabletop",
    "tabletop-lang": "embodrl.sims.tabletop.env:make_tabletop",
    "gym": "embodrl.sims.gym_adapter:make_gym",
    "maniskill": "embodrl.sims.maniskill:make_maniskill",
    **{f"libero-{s}": "embodrl.sims.libero:make_libero" for s in ("spatial", "object", "goal", "10", "90")},
    # LIBERO-PRO's perturbed copies (sims/libero/loader.py)
    **{
        f"libero-{s}-{v}": "embodrl.sims.libero:make_libero"
        for s in ("spatial", "object", "goal", "10")
        for v in ("lan", "object", "swap", "task")
    },
}

# suite name -> "module:table" for suites made of named tasks: table[suite].tasks names them.
SUITE_TASKS: dict[str, str] = {
    "tabletop-basic": "embodrl.sims.tabletop.tasks:SUITES",
    "tabletop-lang": "embodrl.sims.tabletop.tasks:SUITES",
}


def make_env(cfg: EnvConfig, device: str = "cpu") -> VecEnv:
    """Build the VecEnv named by `cfg.suite`."""
    if cfg.suite == NO_SIMULATOR:
        raise UserError(
            "env=none has no simulator: only `embodrl sft` trains without one (from its dataset); "
            "name a suite to play or train in (`embodrl envs` lists them)"
        )
    if cfg.suite not in SUITES:
        raise UserError(f"unknown suite {cfg.suite!r}; valid suites: {', '.join(SUITES)}")
    module, factory = SUITES[cfg.suite].split(":")
    try:
        return getattr(importlib.import_module(module), factory)(cfg, device=device)
    except (MemoryError, ValueError) as error:  # MuJoCo reports a failed allocation as std::bad_alloc
        if isinstance(error, ValueError) and "bad_alloc" not in str(error):
            raise
        raise UserError(
            f"env.num_envs={cfg.num_envs}: {cfg.suite} could not allocate that many envs (out of memory); "
            "lower env.num_envs"
        ) from None


def suite_tasks(suite: str) -> tuple[str, ...] | None:
    """The named tasks of `suite` (each one env.task), or None for a suite that is one env as configured."""
    if suite not in SUITE_TASKS:
        return None
    module, table = SUITE_TASKS[suite].split(":")
    return getattr(importlib.import_module(module), table)[suite].tasks


def describe_suites() -> dict[str, dict[str, list[str]]]:
    """suite -> task -> example instructions, for `embodrl envs`."""
    from embodrl.sims.tabletop import describe

    out = dict(describe())
    out["gym"] = {"<any gymnasium id>": ["set env.gym_id=..., e.g. HalfCheetah-v5"]}
    from embodrl.sims.maniskill.tasks import INSTRUCTIONS

    out["maniskill"] = {task: [text] for task, text in INSTRUCTIONS.items()}
    for suite in SUITES:
        if suite.startswith("libero-"):
            out[suite] = {"<env.task: a task name or index>": ["needs the LIBERO venv: make libero-venv"]}
    return out
