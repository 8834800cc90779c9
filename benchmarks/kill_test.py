"""kill -9 at seeded random points of `embodrl train`, `sft`, `collect` and `deploy`, then resume or reopen.

Per kill: start the command, SIGKILL it after a random delay drawn over the uninterrupted run's duration,
then `--resume` the run to its end (a run killed before its first save starts over) and compare it with an
uninterrupted run: every metrics.jsonl line's deterministic values and the final weights' checksum must be
equal. A killed `collect` must leave a folder that reads as a LeRobot dataset whose every episode decodes
(or no folder at all), which `collect --resume` then completes; a killed `deploy` (the stand-in robot
recording every episode) must leave a recording that reads.

    python benchmarks/kill_test.py --kills 20 --kinds train sft collect deploy --out kill_test.json

Prints one row per kill and a summary; exits 1 when any kill leaves a run that cannot resume, resumes
differently, or a dataset that does not read.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# a small state-MLP PPO run on `reach` (the reach_ppo experiment, shortened)
RL = [
    "reach_ppo",
    "env.num_envs=4",
    "env.max_episode_steps=20",
    "train.eval_every=0",
    "train.eval_episodes=2",
    "train.tensorboard=false",
    "train.videos=0",
]
REACH = ["env.task=reach", "env.num_envs=2", "env.max_episode_steps=20", "policy.obs_keys=[state]"]
KINDS = ("train", "sft", "collect", "deploy")
DEMOS = 12  # episodes a collect run keeps, and a deploy run records
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
# values that repeat exactly in a resumed run (timings do not)
EXACT_KEYS = {
    "train": ("iteration", "train/policy_loss", "train/value_loss", "train/approx_kl", "rollout/return"),
    "sft": ("iteration", "sft/loss", "sft/lr"),
}


@dataclass
class Kill:
    kind: str
    seed: int
    after_s: float  # when SIGKILL was sent, from the start of the command
    outcome: str  # "resumed exactly", "started over", "dataset valid", "no dataset", or what went wrong
    ok: bool


def embodrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "embodrl.cli", *args]


def command(kind: str, root: Path, dataset: Path, checkpoint: Path | None = None) -> list[str]:
    if kind == "deploy":  # the stand-in robot, recording every episode
        return embodrl(
            "deploy",
            f"policy={checkpoint}",
            "robot.kind=sim",
            "robot.task=reach",
            "fps=50",
            "max_steps=20",
            f"episodes={DEMOS}",
            f"record_dir={root / 'recording'}",
        )
    if kind == "train":
        return embodrl("train", *RL, "train.iterations=12", "train.save_every=1", f"run_root={root}")
    if kind == "sft":
        return embodrl(
            "sft",
            *REACH,
            f"sft.dataset={dataset}",
            "sft.steps=150",
            "sft.save_every=10",
            "sft.batch_size=32",
            "sft.eval_episodes=1",
            "train.tensorboard=false",
            "sft.videos=0",
            f"run_root={root}",
        )
    return embodrl("collect", *REACH, "--out", str(root / "demos"), "--episodes-per-task", str(DEMOS))


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=ONE_THREAD)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:5])} ... exited {done.returncode}: {done.stderr[-500:]}")


def run_folder(root: Path) -> Path | None:
    folders = sorted(p.parent for p in root.glob("*/*/config.yaml"))
    return folders[-1] if folders else None


def fingerprint(run_dir: Path, kind: str) -> tuple[list[dict], str]:
    """The deterministic part of metrics.jsonl and the final weights' SHA-256 (from the manifest)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [{k: v for k, v in json.loads(line).items() if k in EXACT_KEYS[kind]} for line in lines]
    manifest = json.loads((run_dir / "checkpoints" / "last" / "manifest.json").read_text())
    return rows, manifest["policy/model.safetensors"]["sha256"]


def check_dataset(folder: Path) -> tuple[str | None, str]:
    """(what is wrong, or None; what was repaired) for the dataset at `folder`, after what a user does next:
    `embodrl check-dataset --repair` (it removes the files of an episode the kill cut short)."""
    from embodrl.data.dataset_check import check_dataset as check

    report = check(folder, repair=True)
    return (None if report.ok else "; ".join(report.problems)), "; ".join(report.repaired)


def first_output(root: Path, kind: str) -> Path | None:
    """What a run writes first once it works: metrics.jsonl, or the dataset's first data file."""
    pattern = {"collect": "demos/data/*/*.parquet", "deploy": "recording/data/*/*.parquet"}.get(
        kind, "*/*/metrics.jsonl"
    )
    return next(iter(root.glob(pattern)), None)


def timed_reference(cmd: list[str], root: Path, kind: str) -> tuple[float, float]:
    """Run `cmd` to its end; returns (seconds until its first output, seconds in all)."""
    start = time.perf_counter()
    process = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ONE_THREAD
    )
    first = None
    while process.poll() is None:
        if first is None and first_output(root, kind) is not None:
            first = time.perf_counter() - start
        time.sleep(0.05)
    total = time.perf_counter() - start
    if process.returncode != 0:
        raise RuntimeError(f"the uninterrupted {kind} run failed: {process.stderr.read()[-500:]}")
    return (first or total), total


def kill_once(
    kind: str,
    seed: int,
    work: Path,
    dataset: Path,
    reference,
    window: tuple[float, float],
    checkpoint: Path | None = None,
) -> Kill:
    root = work / f"{kind}-{seed}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    # over the working part of the run (most of a short run is Python starting up), a little either side
    first, total = window
    after = random.Random(seed).uniform(0.8 * first, 1.05 * total)
    process = subprocess.Popen(
        command(kind, root, dataset, checkpoint),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ONE_THREAD,
    )
    try:
        process.wait(timeout=after)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGKILL)
        process.wait()
    if kind == "deploy":  # the recording of the episodes that ended reads whole (or nothing was recorded)
        folder = root / "recording"
        if not folder.exists():
            return Kill(kind, seed, after, "nothing recorded yet", True)
        problem, repaired = check_dataset(folder)
        outcome = f"recording valid{' after check-dataset --repair: ' + repaired if repaired else ''}"
        return Kill(kind, seed, after, problem or outcome, problem is None)
    if kind == "collect":  # the killed folder reads; `collect --resume` then completes it
        folder = root / "demos"
        repaired = ""
        if folder.exists():
            problem, repaired = check_dataset(folder)
            if problem:
                return Kill(kind, seed, after, f"killed dataset does not read: {problem}", False)
        try:
            if folder.exists():
                resume = [a if a != "--out" else "--resume" for a in command(kind, root, dataset)]
                run(resume)
                outcome = (
                    f"valid{' after --repair (' + repaired + ')' if repaired else ''}, resumed to a whole"
                )
            else:
                run(command(kind, root, dataset))
                outcome = "no dataset yet, started over"
        except Exception as error:  # noqa: BLE001
            return Kill(kind, seed, after, f"could not resume: {error}", False)
        problem, _ = check_dataset(folder)
        from embodrl.data.lerobot_dataset import LeRobotDataset

        if problem is None and LeRobotDataset(folder).num_episodes != DEMOS:
            problem = f"{LeRobotDataset(folder).num_episodes} episodes after the resume, not {DEMOS}"
        return Kill(kind, seed, after, problem or outcome, problem is None)
    folder = run_folder(root)
    try:
        if folder is None:  # killed before the run folder existed: a user runs the command again
            run(command(kind, root, dataset))
            outcome = "started over"
        else:
            run(embodrl(kind, "--resume", str(folder)))
            outcome = "resumed exactly"
        got = fingerprint(run_folder(root), kind)
    except Exception as error:  # noqa: BLE001
        return Kill(kind, seed, after, f"could not resume: {error}", False)
    if got != reference:
        return Kill(kind, seed, after, "resumed, but differs from the uninterrupted run", False)
    return Kill(kind, seed, after, outcome, True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kinds", nargs="+", default=["train", "sft", "collect", "deploy"], choices=list(KINDS)
    )
    parser.add_argument("--kills", type=int, default=20, help="kill points per kind")
    parser.add_argument("--seed", type=int, default=0, help="first kill point's seed")
    parser.add_argument("--out", help="write every kill as JSON here")
    args = parser.parse_args(argv)
    kills: list[Kill] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dataset = work / "reach_demos"
        run(embodrl("collect", *REACH, "--out", str(dataset), "--episodes-per-task", "4"))
        checkpoint = None
        if "deploy" in args.kinds:  # a policy to deploy: an SFT run on the demos
            run(command("sft", work / "policy", dataset))
            checkpoint = run_folder(work / "policy") / "checkpoints" / "last" / "policy"
        for kind in args.kinds:
            reference_root = work / f"{kind}-reference"
            reference_root.mkdir()
            reference_cmd = command(kind, reference_root, dataset, checkpoint)
            window = timed_reference(reference_cmd, reference_root, kind)
            exact = kind in EXACT_KEYS
            reference = fingerprint(run_folder(reference_root), kind) if exact else None
            print(
                f"{kind}: uninterrupted run {window[1]:.1f} s, first output at {window[0]:.1f} s", flush=True
            )
            for seed in range(args.seed, args.seed + args.kills):
                kill = kill_once(kind, seed, work, dataset, reference, window, checkpoint)
                kills.append(kill)
                print(f"  kill at {kill.after_s:5.2f} s (seed {seed}): {kill.outcome}", flush=True)
    failed = [k for k in kills if not k.ok]
    print(f"{len(kills)} kill points, {len(failed)} left a run or dataset that does not recover")
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(k) for k in kills], indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
