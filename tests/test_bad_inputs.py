"""Every bad input a user may type is a one-line error with exit code 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from embodrl.cli import main


def make_files(tmp: Path) -> None:
    """The files and folders that the bad command lines point at."""
    (tmp / "bad.yaml").write_text("env:\n  task: [pick\n")
    (tmp / "list.yaml").write_text("- env\n- policy\n")
    (tmp / "defaults.yaml").write_text("defaults:\n  robot: franka\n")
    (tmp / "empty_dir").mkdir()
    (tmp / "full_dir").mkdir()
    (tmp / "full_dir" / "x").write_text("x")


def bad_command_lines(tmp: Path) -> list[list[str]]:
    """Bad configs, overrides, paths and options of every command; `tmp` holds what `make_files` made."""
    bad_yaml, a_list, bad_defaults = tmp / "bad.yaml", tmp / "list.yaml", tmp / "defaults.yaml"
    not_a_dataset, full = tmp / "empty_dir", tmp / "full_dir"
    missing = str(tmp / "missing")
    train = [
        ["no_such_experiment"],
        [str(tmp / "missing.yaml")],
        [str(bad_yaml)],
        [str(a_list)],
        [str(bad_defaults)],
        ["justaword"],
        ["nokey=1"],
        ["env.nokey=1"],
        ["env=nope"],
        ["policy=nope"],
        ["algo=nope"],
        ["engine=nope"],
        ["env.num_envs=zero"],
        ["env.num_envs=0"],
        ["env.num_envs=-4"],
        ["env.num_envs=1000000000"],
        ["env.suite=nope"],
        ["env.task=fly"],
        ["env.max_episode_steps=0"],
        ["env.image_size=0"],
        ["seed=abc"],
        ["policy.family=nope"],
        ["policy.chunk_size=0"],
        ["policy.action_dim=-3"],
        ["policy.action_dim=4"],
        ["policy.obs_keys=[]"],
        ["policy.obs_keys=[lidar]"],
        ["policy.logprob_type=nope"],
        ["policy.state_normalization=nope"],
        ["policy.action_normalization=nope"],
        ["policy.image_shift=-1"],
        ["policy.sft_aux_keys=[rgb]"],
        ["policy.sft_aux_weight=-1"],
        ["policy.init_from=" + missing],
        ["train.iterations=-1"],
        ["train.save_every=0"],
        ["engine.schedule=nope"],
        ["--resume", missing],
        ["--resume", str(not_a_dataset)],
    ]
    sft = [
        [],
        ["sft.dataset=" + missing],
        ["sft.dataset=" + str(not_a_dataset)],
        ["sft.steps=0"],
        ["sft.batch_size=0"],
        ["sft.max_episodes=-1"],
        ["--resume", missing],
    ]
    out = str(tmp / "demos")
    collect = [
        ["--out", str(full)],
        ["--out", out, "--episodes-per-task", "0"],
        ["--out", out, "--tasks", "fly"],
        ["--out", out, "env.task=pick", "--tasks", "push"],
        ["--out", out, "--noise", "-1"],
        ["--out", out, "env.suite=nope"],
    ]
    return [
        *(["train", *args] for args in train),
        *(["sft", "reach_ppo", *args] for args in sft),
        *(["collect", *args] for args in collect),
        ["envs", "--suite", "nope"],
        ["play", "env.num_envs=zero"],
        ["play", "env.suite=nope"],
        ["play", "--policy", missing],
        ["eval", missing],
        ["eval", str(not_a_dataset)],
        ["deploy"],
        ["deploy", "policy.checkpoint=/x"],
        ["deploy", f"policy={missing}"],
        ["deploy", "nokey=1"],
        ["serve", missing],
        ["convert", "pi0-import", missing, str(tmp / "converted")],
        ["convert", "merge-lora", missing, str(tmp / "merged")],
    ]


def test_there_are_at_least_60_bad_inputs(tmp_path):
    assert len(bad_command_lines(tmp_path)) >= 60


@pytest.mark.parametrize("index", range(len(bad_command_lines(Path("tmp")))))
def test_a_bad_input_is_one_line_and_exit_code_2(index, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # run folders of commands that start go here
    make_files(tmp_path)
    args = bad_command_lines(tmp_path)[index]
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("run folder")]
    assert code == 2, (args, err)
    assert "Traceback" not in err, (args, err)
    assert len(lines) == 1 and lines[0].startswith("embodrl "), (args, err)
