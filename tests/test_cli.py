import json
import signal
import subprocess
import sys
import time

import pytest

from embodrl.cli import build_parser, main
from embodrl.config import compose
from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.sims.registry import make_env
from embodrl.sims.tabletop.tasks import TASK_NAMES
from embodrl.train.policy_setup import build_policy
from embodrl.train.rl_runner import OnPolicyRunner

COMMANDS = [
    "envs",
    "play",
    "train",
    "collect",
    "sft",
    "eval",
    "check-dataset",
    "serve",
    "deploy",
    "convert",
    "learner",
    "actor",
]


def test_every_command_has_help(capsys):
    parser = build_parser()
    for command in COMMANDS:
        with pytest.raises(SystemExit) as done:
            parser.parse_args([command, "--help"])
        assert done.value.code == 0
        text = capsys.readouterr().out
        assert len(text) > 200, command
        assert "%%" not in text, command  # a description is printed as written: no %-escapes


def test_console_script_group_help_lists_commands():
    out = subprocess.run(
        [sys.executable, "-m", "embodrl.cli", "--help"], capture_output=True, text=True, check=True
    )
    for command in COMMANDS:
        assert command in out.stdout


def test_envs_lists_suites_tasks_and_instructions(capsys):
    assert main(["envs", "--suite", "tabletop-lang"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tabletop-lang") and "pick" in out and "put the" in out


def test_user_errors_are_one_line_without_traceback(capsys):
    assert main(["envs", "--suite", "nope"]) == 2
    assert main(["play", "env.num_envs=zero"]) == 2
    assert main(["play", "env.suite=nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("embodrl ") for line in err)
    assert "valid suites: tabletop-basic" in err[0] and "env.num_envs" in err[1]


def test_a_run_that_fails_while_starting_leaves_no_run_folder(tmp_path, capsys):
    assert main(["train", "reach_ppo", "env.task=fly", f"run_root={tmp_path}"]) == 2
    assert main(["sft", "reach_ppo", f"sft.dataset={tmp_path / 'none'}", f"run_root={tmp_path}"]) == 2
    assert list(tmp_path.iterdir()) == []
    assert "run folder removed" in capsys.readouterr().err
    # A resumed run's folder stays, even when it holds nothing but its config.
    run_dir = tmp_path / "kept"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("name: reach_ppo\nenv:\n  task: fly\n")
    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "unknown task 'fly'" in err and "removed" not in err
    assert (run_dir / "config.yaml").is_file()


@pytest.mark.parametrize("command", ["play", "rollout"])  # rollout: play's former name, kept as an alias
def test_play_expert_writes_videos_and_summary(tmp_path, capsys, command):
    args = [
        command,
        f"run_root={tmp_path}",
        "env.task=reach",
        "env.num_envs=2",
        "--episodes",
        "2",
        "--record",
        "1",
    ]
    assert main(args) == 0
    (run_dir,) = (tmp_path / "default").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["success_rate"] == 1.0
    assert (run_dir / "episode_000.mp4").stat().st_size > 0 and (run_dir / "config.yaml").is_file()


def test_overrides_may_follow_options_and_unknown_flags_still_fail(tmp_path, capsys):
    args = ["play", "--episodes", "1", f"run_root={tmp_path}", "env.task=reach", "env.num_envs=1"]
    assert main(args) == 0
    (run_dir,) = (tmp_path / "default").iterdir()
    assert "task: reach" in (run_dir / "config.yaml").read_text()
    with pytest.raises(SystemExit):
        main(["play", "--episodes", "1", "--no-such-flag"])
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_collect_sft_eval_chain(tmp_path, capsys):
    data = tmp_path / "demos"
    common = [
        "env.task=reach",
        "env.num_envs=4",
        f"run_root={tmp_path}",
        "policy.obs_keys=[state]",
        "policy.value_obs_keys=[state,privileged]",  # a critic key the actor does not read: replays need it
    ]
    assert (
        main(["collect", *common[:2], "--out", str(data), "--episodes-per-task", "4", "--first-state", "900"])
        == 0
    )
    assert (data / "meta" / "info.json").is_file()
    assert min(LeRobotDataset(data).episodes["init_state_id"]) in range(900, 904)  # in order of completion
    sft = [
        *common,
        f"sft.dataset={data}",
        "sft.steps=20",
        "sft.batch_size=32",
        "sft.eval_every=0",
        "sft.eval_episodes=4",
        "name=bc",
        "train.tensorboard=false",
    ]
    assert main(["sft", *sft]) == 0
    (run_dir,) = (tmp_path / "bc").iterdir()
    checkpoint = run_dir / "checkpoints" / "last" / "policy"
    assert (checkpoint / "model.safetensors").is_file()
    assert main(["eval", str(checkpoint), "--episodes", "4", "--record", "1"]) == 0
    replay = [*common[:2], f"run_root={tmp_path}", "name=replay", "--policy", str(checkpoint)]
    for _ in range(2):
        assert main(["play", *replay, "--episodes", "2", "--record", "1", "--format", "mp4"]) == 0
    first, second = sorted((tmp_path / "replay").iterdir())
    # seeded: the checkpoint's noise draws repeat, so the two plays are the same episode
    assert (first / "episode_000.mp4").read_bytes() == (second / "episode_000.mp4").read_bytes()
    assert not (checkpoint / "eval").exists()  # the next save of a resumed run would delete it
    (evaluated,) = (run_dir / "eval").iterdir()  # beside the run's checkpoints
    summary = json.loads((evaluated / "summary.json").read_text())
    assert summary["episodes"] == 4 and (evaluated / "videos" / "episode_000.mp4").is_file()
    # seeded with the run's seed: the evaluation the SFT run ended with (the flow policy's start noise
    # included), repeated exactly, down to the video of its first episode
    video = "videos/episode_000.mp4"
    assert (evaluated / video).read_bytes() == (run_dir / video).read_bytes()
    assert "success:" in capsys.readouterr().out
    # --first-state moves the episodes to other initial states (a held-out set)
    shifted = tmp_path / "shifted"
    assert (
        main(["eval", str(checkpoint), "--episodes", "1", "--first-state", "4", "--out", str(shifted)]) == 0
    )
    assert (shifted / video).read_bytes() != (run_dir / video).read_bytes()
    # --demos replays the collected demos in the env: exact replays, so the policy sees the same inputs
    # there as in the dataset and its actions are the same
    replayed = ["eval", str(checkpoint), "--demos", str(data), "--episodes", "3", "--out", str(shifted)]
    assert main(replayed) == 0
    report = json.loads((shifted / "demo_replay.json").read_text())
    assert report["episodes"] == 3 and report["steps"] > 3 and report["max_state_drift"] == 0.0
    assert report["error_on_env_obs"] == report["error_on_dataset_frames"] > 0.0
    assert report["env_vs_dataset_action_gap"] == 0.0 and report["camera_difference"] is None
    per_dimension = report["error_per_dimension"]
    assert list(per_dimension)[::6] == ["dx", "gripper"]  # the env's 7-D ee_delta names
    assert sum(per_dimension.values()) / 7 == pytest.approx(report["error_on_env_obs"])
    assert "on the recorded frames" in capsys.readouterr().out
    # --first-demo K replays episodes K.. (those sft.max_episodes=K left out); past the last: an error
    later = tmp_path / "later"
    assert main([*replayed[:-1], str(later), "--first-demo", "2"]) == 0
    assert json.loads((later / "demo_replay.json").read_text())["episodes"] == 2  # episodes 2 and 3 of 4
    assert "(episodes 2-3," in capsys.readouterr().out
    assert main([*replayed, "--first-demo", "4"]) == 2
    assert "from episode 4 on" in capsys.readouterr().err


def test_sigterm_saves_the_run_like_ctrl_c(tmp_path):
    """`kill`, SLURM preemption or `docker stop` must not lose the iterations since the last checkpoint."""
    command = [
        sys.executable,
        "-m",
        "embodrl.cli",
        "train",
        "reach_ppo",
        "env.num_envs=4",
        f"run_root={tmp_path}",
    ]
    command += ["name=term", "train.iterations=100000", "train.save_every=100000", "train.eval_every=0"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = None
    for _ in range(600):  # up to 2 minutes to finish two iterations
        found = list(tmp_path.glob("term/*/metrics.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 2:
            metrics = found[0]
            break
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert metrics is not None, stderr
    assert process.returncode == 128 + signal.SIGTERM and "embodrl train: terminated" in stderr
    run_dir = metrics.parent
    logged = len(metrics.read_text().splitlines())
    resumed = OnPolicyRunner(compose(str(run_dir / "config.yaml"), []), run_dir, resume=True)
    assert resumed.iteration == logged >= 2  # the iteration running at the signal finished and was saved
    resumed.schedule.close()


def test_eval_prints_the_envs_episode_flags_next_to_success(tmp_path, capsys):
    overrides = [
        "env.suite=tabletop-lang",
        "env.num_envs=2",
        "env.max_episode_steps=3",
        "policy.family=gaussian",
    ]
    cfg = compose(None, overrides)
    with make_env(cfg.env) as env:
        build_policy(cfg, env).save_pretrained(tmp_path / "policy")
    assert (
        main(["eval", str(tmp_path / "policy"), "--episodes", "2", "--out", str(tmp_path), *overrides]) == 0
    )
    out = capsys.readouterr().out
    flag = json.loads((tmp_path / "summary.json").read_text())["flags"]["wrong_object"]
    assert f"\nwrong_object: {flag['rate']:.1%} of episodes\n" in out
    for text, share in flag["per_instruction"].items():  # beside each instruction's success
        assert f"  wrong_object {share:6.1%}  {text}\n" in out
    per_task = json.loads((tmp_path / "summary.json").read_text())["per_task"]
    assert per_task and set(per_task) <= set(TASK_NAMES)  # both episodes' tasks, each with its success
    for task, share in flag["per_task"].items():
        assert f"{per_task[task]:6.1%}  wrong_object {share:6.1%}  {task}\n" in out
