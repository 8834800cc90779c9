"""embodrl eval --perturb: levels parsed, every level paired with the nominal episodes, axes the env or the
policy cannot take refused (or left out by `all`), and the same command twice gives the same table."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from embodrl.cli import main
from embodrl.config import compose
from embodrl.errors import ConfigError, UserError
from embodrl.sims.config import EnvConfig
from embodrl.sims.perturbation import AXES
from embodrl.sims.registry import make_env
from embodrl.train.policy_setup import build_policy
from embodrl.train.robustness import Level, parse_perturb, reads_instruction_text, run_robustness

REACH = EnvConfig(suite="tabletop-basic", task="reach", num_envs=4, max_episode_steps=25)


class ReachPolicy(nn.Module):
    """Steers the hand to the target from the privileged observation (object - ee at [10:13]), with a
    little noise from torch's RNG so that the evaluation seed matters."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.tensor(12.0))
        self.cfg = SimpleNamespace(read_keys=("state", "privileged"), instruction_table=())

    def set_instruction_table(self, instructions) -> None:
        self.cfg.instruction_table = tuple(instructions)

    def act(self, obs, deterministic: bool = False):
        move = self.gain.detach() * obs["privileged"][:, 10:13] + 0.3 * torch.randn(obs.batch_size[0], 3)
        actions = torch.cat([move.clamp(-1, 1), -torch.ones(obs.batch_size[0], 4)], -1)
        return SimpleNamespace(actions=actions[:, None])


def test_parse_perturb_levels_and_errors():
    assert parse_perturb(["friction", "latency=2", "mass=1,3"]) == [
        *(Level("friction", v) for v in (1, 2, 3)),
        Level("latency", 2),
        Level("mass", 1),
        Level("mass", 3),
    ]
    assert parse_perturb(["conflict"]) == [Level("conflict", 1), Level("conflict", 2)]
    assert {level.axis for level in parse_perturb(["all"])} == set(AXES)
    for bad, message in [
        ("wind", "unknown axis 'wind'"),
        ("env.num_envs=4", "give key=value overrides before --perturb"),
        ("conflict=3", "conflict has levels 1, 2, not [3]"),
        ("mass=x", "levels are integers"),
    ]:
        with pytest.raises(UserError, match=message.replace("[", r"\[")):
            parse_perturb([bad])


def test_every_level_plays_the_nominal_episodes_and_counts_the_flips():
    levels = [Level("latency", 3), Level("spawn", 3)]
    report = run_robustness(ReachPolicy(), REACH, levels, episodes=8, seed=0)
    nominal, *rows = report["rows"]
    assert (nominal["axis"], [(r["axis"], r["level"]) for r in rows]) == (
        "nominal",
        [("latency", 3), ("spawn", 3)],
    )
    assert 0 < nominal["success_rate"]
    for row in rows:
        assert row["episodes"] == 8
        assert row["drop"] == pytest.approx(row["success_rate"] - nominal["success_rate"])
        assert (row["gained"] - row["lost"]) / 8 == pytest.approx(row["drop"])
    assert any(row["lost"] for row in rows)  # the perturbations cost this controller episodes
    again = run_robustness(ReachPolicy(), REACH, [Level("friction", 1)], episodes=8, seed=0)
    assert again["rows"][0] == nominal  # the nominal row does not depend on the levels asked for


def test_an_axis_named_that_cannot_run_fails_before_any_episode_and_all_leaves_it_out():
    with pytest.raises(ConfigError, match="camera changes images: it needs env.obs_mode=rgb"):
        run_robustness(ReachPolicy(), REACH, [Level("camera", 1)], episodes=4, seed=0)
    with pytest.raises(
        UserError, match="instruction changes the instruction text, which this policy does not read"
    ):
        run_robustness(ReachPolicy(), REACH, [Level("instruction", 1)], episodes=4, seed=0)
    report = run_robustness(
        ReachPolicy(), REACH, parse_perturb(["all=1"]), episodes=4, seed=0, explicit=False
    )
    assert [row["axis"] for row in report["rows"]] == [
        "nominal",
        "size",
        "distractors",
        "spawn",
        "proprio_noise",
        "latency",
        "mass",
        "friction",
        "gains",
        "object_noise",
        "action_noise",
    ]


def test_the_same_perturb_command_twice_gives_the_same_table(tmp_path, capsys):
    overrides = ["env.task=reach", "env.num_envs=2", "env.max_episode_steps=5", "env.reward=dense"]
    overrides.append("policy.family=gaussian")
    cfg = compose(None, overrides)
    with make_env(cfg.env) as env:
        build_policy(cfg, env).save_pretrained(tmp_path / "policy")
    tables = []
    for run, seed in (("a", 0), ("b", 0), ("c", 1)):
        command = ["eval", str(tmp_path / "policy"), *overrides, f"env.randomize.seed={seed}"]
        command += ["--episodes", "2", "--out", str(tmp_path / run)]
        assert main([*command, "--perturb", "latency=2", "proprio_noise=3", "--stochastic"]) == 0
        tables.append(capsys.readouterr().out.split("\n", 1)[1].rsplit("outputs:", 1)[0])
    assert tables[0] == tables[1] and "proprio_noise     3" in tables[0]
    reports = [json.loads((tmp_path / run / "robustness.json").read_text()) for run in ("a", "b", "c")]
    assert reports[0] == reports[1] and len(reports[0]["rows"]) == 3
    # the dense returns tell the draws apart: another perturbation seed, other noise (the nominal row alike)
    returns = [[row["mean_return"] for row in report["rows"]] for report in reports]
    assert returns[2][0] == returns[0][0] and returns[2][1:] != returns[0][1:]
    assert (tmp_path / "a" / "robustness.png").stat().st_size > 0


@pytest.mark.parametrize(("preset", "reads"), [("flow_vla_nano", True), ("flow_state", False)])
def test_a_language_policy_is_told_apart_by_its_actions(preset, reads):
    cfg = compose(None, ["env=tabletop_lang", f"policy={preset}", "env.num_envs=2", "env.task=pick"])
    with make_env(cfg.env) as env:
        assert reads_instruction_text(build_policy(cfg, env), env) is reads
