"""Robustness evaluation: one checkpoint on the nominal env and on perturbed ones (`embodrl eval --perturb`).

Every level plays the same episodes (initial-state ids) with the same policy noise as the nominal run,
so each perturbed result is paired with the nominal one: `lost` and `gained` count the episodes that
flipped. The perturbations are the env's (sims/perturbation.py: env.randomize with exact=true).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from embodrl.errors import UserError
from embodrl.sims.base import VecEnv
from embodrl.sims.config import EnvConfig
from embodrl.sims.perturbation import AXES, RandomizeConfig, axis_unit, exact
from embodrl.sims.registry import make_env
from embodrl.train.episodes import EpisodeResults
from embodrl.train.evaluation import evaluate_policy, seeded_torch_rng, summarize
from embodrl.train.policy_setup import read_prompts_through


@dataclass(frozen=True)
class Level:
    """One row of the table: an axis at one level (axis "nominal", level 0: no perturbation)."""

    axis: str
    level: int


def parse_perturb(items: list[str]) -> list[Level]:
    """`NAME`, `NAME=2` or `NAME=1,3` per item (no level: all of the axis's levels; `all`: every axis)."""
    out: list[Level] = []
    for item in items:
        name, _, levels = item.partition("=")
        names = list(AXES) if name == "all" else [name]
        if name != "all" and name not in AXES:
            hint = " (give key=value overrides before --perturb)" if "." in name else ""
            raise UserError(f"--perturb {item}: unknown axis {name!r}; axes: all, {', '.join(AXES)}{hint}")
        for axis in names:
            valid = AXES[axis].levels
            try:
                wanted = [int(v) for v in levels.split(",")] if levels else list(valid)
            except ValueError:
                raise UserError(f"--perturb {item}: levels are integers, e.g. {axis}=1,2") from None
            bad = [v for v in wanted if v not in valid]
            if bad:
                raise UserError(
                    f"--perturb {item}: {axis} has levels {', '.join(map(str, valid))}, not {bad}"
                )
            out += [Level(axis, v) for v in wanted if Level(axis, v) not in out]
    return out


def applicable(levels: list[Level], env_cfg: EnvConfig, reads_text: bool, explicit: bool) -> list[Level]:
    """The levels this env and policy can run. An axis named explicitly that cannot run is a one-line error;
    `all` leaves it out."""
    kept = []
    for level in levels:
        try:
            if AXES[level.axis].needs == "language" and not reads_text:
                raise UserError(
                    f"perturbation axis {level.axis} changes the instruction text, which this policy does "
                    "not read (its actions do not change with the text, or it embeds task ids)"
                )
            _level_config(env_cfg, level)
        except UserError:  # ConfigError is one
            if explicit:
                raise
            continue
        kept.append(level)
    return kept


def _level_config(env_cfg: EnvConfig, level: Level) -> EnvConfig:
    """The env of one row (its ConfigError names an axis the env cannot apply)."""
    seed = env_cfg.randomize.seed
    randomize = (
        RandomizeConfig(seed=seed) if level.axis == "nominal" else exact(level.axis, level.level, seed)
    )
    return dataclasses.replace(env_cfg, randomize=randomize)


def reads_instruction_text(policy, env: VecEnv) -> bool:
    """Whether the policy's actions depend on the instruction text (what the text axes change): its actions
    on one observation with the env's table and with a blank one. A policy that embeds task ids reads none
    (and the text axes' larger tables would overrun its embedding)."""
    if "task_id" in policy.cfg.read_keys or "task_id" not in env.observation_spec:
        return False
    obs = env.reset_to(torch.zeros(env.num_envs, dtype=torch.long))
    own, actions = policy.cfg.instruction_table, []
    for table in (env.instruction_table, [""] * len(env.instruction_table)):
        policy.set_instruction_table(table)
        with torch.no_grad(), seeded_torch_rng(0, next(policy.parameters()).device):
            actions.append(policy.act(obs, deterministic=True).actions)
    policy.set_instruction_table(own)
    return not torch.equal(*actions)


def _row(level: Level, results: EpisodeResults, nominal: EpisodeResults | None) -> dict:
    summary = summarize(results)
    row = {
        "axis": level.axis,
        "level": level.level,
        "episodes": summary["episodes"],
        "success_rate": summary["success_rate"],
        "success_ci95": summary["success_ci95"],
        "mean_length": summary["mean_length"],
        "mean_return": summary["mean_return"],
        "flags": {name: flag["rate"] for name, flag in summary["flags"].items()},
    }
    if nominal is not None:
        pairs = list(zip(nominal.success, results.success, strict=True))
        row["drop"] = summary["success_rate"] - nominal.success_rate
        row["lost"] = sum(a and not b for a, b in pairs)  # nominal successes this level fails
        row["gained"] = sum(b and not a for a, b in pairs)
    return row


def run_robustness(
    policy,
    env_cfg: EnvConfig,
    levels: list[Level],
    episodes: int,
    seed: int,
    first_state_id: int = 0,
    deterministic: bool = True,
    explicit: bool = True,
    device: str = "cpu",
    on_row: Callable[[dict], None] | None = None,
) -> dict:
    """The nominal row, then one per level the env and policy can run (`explicit`: every one named must
    be), each from states first_state_id + [0, episodes); `on_row` sees each row as it is done."""
    rows: list[dict] = []
    nominal: EpisodeResults | None = None
    planned = [Level("nominal", 0), *levels]
    while planned:
        level = planned.pop(0)
        with make_env(_level_config(env_cfg, level), device=device) as env:
            read_prompts_through(policy, env.instruction_table)
            if nominal is None:  # before any episode: a level that cannot run fails at once
                planned = applicable(planned, env_cfg, reads_instruction_text(policy, env), explicit)
            results = evaluate_policy(
                policy, env, episodes, deterministic=deterministic, seed=seed, first_state_id=first_state_id
            )
        rows.append(_row(level, results, nominal))
        nominal = nominal or results
        if on_row is not None:
            on_row(rows[-1])
    return {
        "episodes": episodes,
        "first_state_id": first_state_id,
        "perturbation_seed": env_cfg.randomize.seed,
        "deterministic": deterministic,
        "units": {row["axis"]: axis_unit(row["axis"], env_cfg.suite) for row in rows[1:]},
        "rows": rows,
    }


def header(flags: list[str]) -> str:
    return (
        f"{'axis':<14}{'level':>5}  {'success':>7}  {'95% CI':<13}{'vs nominal':>10}  {'lost/gained':>11}"
        + "".join(f"  {name:>12}" for name in flags)
    )


def format_row(row: dict) -> str:
    lo, hi = row["success_ci95"]
    level = "-" if row["axis"] == "nominal" else str(row["level"])
    drop = f"{100 * row['drop']:+.1f} pt" if "drop" in row else ""
    flips = f"{row['lost']}/{row['gained']}" if "lost" in row else ""
    flags = "".join(f"  {rate:12.1%}" for rate in row["flags"].values())
    return (
        f"{row['axis']:<14}{level:>5}  {row['success_rate']:7.1%}  {f'{lo:.1%}-{hi:.1%}':<13}{drop:>10}  "
        f"{flips:>11}{flags}"
    )


def print_row(row: dict) -> None:
    """A row as it is done; the nominal one (the first) under the table's header."""
    if row["axis"] == "nominal":
        print(header(list(row["flags"])))
    print(format_row(row), flush=True)


def format_table(report: dict) -> str:
    flags = list(report["rows"][0]["flags"])
    return "\n".join([header(flags), *(format_row(row) for row in report["rows"])])


def write_report(report: dict, out: Path) -> Path | None:
    """robustness.json and robustness.png into `out`; the plot's path, None without matplotlib."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "robustness.json").write_text(json.dumps(report, indent=2))
    from embodrl.train.robustness_plot import plot_robustness

    return plot_robustness(report, out / "robustness.png")
