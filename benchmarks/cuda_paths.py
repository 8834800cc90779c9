"""CUDA paths end to end: every policy family and algorithm, bf16, the engine's schedules and transports,
torchrun (NCCL: DDP and FSDP), pi0's full 3B shape and ManiSkill3's GPU simulation, each run briefly on
one GPU, with a table of what ran, how fast and how much GPU memory it held.

Each job is a real `embodrl train` (or `torchrun ... embodrl.cli train`) in its own process with a
time limit; jobs of a phase run side by side (they are checks: their wall-clock is indicative, the
learning and throughput phases run alone). Phases, in order:
  1. ManiSkill3 GPU-sim throughput, raw and through the adapter (benchmarks/adapter_throughput.py);
  2. learning: PPO on ManiSkill PushCube-v1 with physx_cuda, and state PPO on the tabletop `reach`;
  3. checks: each family x algorithm (with a short SFT when --demos is given), bf16, pipelined /
     async schedules, the multiprocess transport, torchrun DDP and FSDP over NCCL, and pi0-3B
     (random weights: the GPU recipe's shape, memory and step time; no checkpoint is downloaded).

    python benchmarks/cuda_paths.py --demos data/pick_demos_pos        # one GPU, ~7 minutes
    python benchmarks/cuda_paths.py --device cpu --quick               # the same jobs at toy sizes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass
class Job:
    label: str
    args: list[str]  # experiment and overrides for `embodrl train`, or a full command when `raw`
    timeout: float
    torchrun: bool = False
    raw: bool = False
    result: dict = field(default_factory=dict)


def _train_jobs(
    device: str, quick: bool, demos: str | None, maniskill: bool = True
) -> tuple[list[Job], list[Job]]:
    """(learning jobs, check jobs) for `device`; --quick shrinks every job to a few seconds of CPU."""
    its = "train.iterations=1" if quick else "train.iterations=3"
    small = (
        ["env.num_envs=4", "train.eval_episodes=4", "env.num_threads=2"] if quick else ["env.num_threads=2"]
    )
    common = [f"device={device}", its, "train.eval_every=0", "train.save_every=1000", *small]
    sft = [f"sft.dataset={demos}", "sft.steps=20" if quick else "sft.steps=500", "sft.eval_episodes=8"]
    pick = ["pick_flow_noise", *(sft if demos else ["sft.dataset="]), "train.eval_episodes=16", *common]
    nano = ["pi0_flow_noise_nano", *common, "env.num_envs=4" if quick else "env.num_envs=16"]
    learning = [
        Job(
            "tabletop reach, state PPO (60 it)",
            ["reach_ppo", f"device={device}", "env.num_threads=4", *quick * ["train.iterations=2"]],
            150,
        ),
    ]
    if device.startswith("cuda") and maniskill:
        learning.insert(
            0,
            Job(
                "ManiSkill PushCube-v1 GPU sim, state PPO, 2048 envs",
                [
                    "reach_ppo",
                    "name=maniskill_push_ppo",
                    f"device={device}",
                    "env.suite=maniskill",
                    "env.task=PushCube-v1",
                    "env.reward=dense",
                    "env.num_envs=2048",
                    "env.max_episode_steps=50",
                    "train.rollout_steps=20",
                    "train.iterations=60",
                    "train.eval_every=10",
                    "train.eval_episodes=512",
                    "algo.gamma=0.8",
                    "algo.num_epochs=8",
                    "algo.minibatch_size=1280",
                    "algo.critic_warmup_iters=0",
                    "algo.target_kl=0.2",
                ],
                150,
            ),
        )
    checks = [
        Job("flow + Flow-Noise PPO" + (" (SFT -> RL)" if demos else ""), pick, 150),
        Job("flow + Flow-SDE PPO", [*pick, "policy.flow.likelihood=sde"], 150),
        Job(
            "diffusion + DPPO",
            [*pick, "policy.family=diffusion", "policy.action_normalization=quantile"],
            150,
        ),
        Job("flow + GRPO", [*pick, "algo=grpo", "algo.group_size=4"], 150),
        Job("nano pi0 (image + language) Flow-Noise PPO", nano, 150),
        Job("nano pi0, bf16 update", [*nano, "train.precision=bf16"], 150),
        Job("nano pi0, pipelined K=2", [*nano, "engine=pipelined"], 150),
        Job("nano pi0, async (staleness 1)", [*nano, "engine=async"], 150),
        Job("nano pi0, multiprocess transport", [*nano, "engine=multiprocess"], 150),
        Job(
            "nano pi0, disaggregated + offload",
            [*nano, "engine.placement=disaggregated", "engine.offload=true"],
            150,
        ),
        Job(
            "nano OpenVLA-OFT (autoregressive) GRPO",
            ["openvla_oft_grpo_nano", *common, "env.num_envs=8" if quick else "env.num_envs=16"],
            150,
        ),
        Job("torchrun DDP, 1 rank", ["reach_ppo", *common], 150, torchrun=True),
        Job(
            "torchrun FSDP, 1 rank, nano pi0",
            [*nano, "engine.data_parallel=fsdp"],
            150,
            torchrun=True,
        ),
    ]
    if not quick:  # pi0's published shape: 3.3 B parameters, 224 px base + wrist cameras; first: the longest
        checks.insert(
            0,
            Job(
                "pi0-3B shape (random weights), bf16, Flow-Noise PPO",
                [
                    "pi0_flow_noise_nano",
                    "policy=pi0_3b",
                    "policy.chunk_size=5",
                    "policy.flow.num_steps=4",
                    "env.image_size=224",
                    "env.wrist_camera=true",
                    "env.num_envs=8",
                    "algo.minibatch_size=16",
                    "train.precision=bf16",
                    *common,
                    "train.iterations=2",  # later overrides win
                    "train.eval_episodes=8",
                ],
                300,
            ),
        )
    return learning, checks


def _slug(job: Job) -> str:
    return "".join(c if c.isalnum() else "_" for c in job.label)[:48]


def _command(job: Job, run_root: Path) -> list[str]:
    if job.raw:
        return job.args
    launcher = [sys.executable, "-m", "embodrl.cli"]
    if job.torchrun:  # one rank: the NCCL (CUDA) or gloo (CPU) process group, DDP/FSDP wrapping, rank-0 I/O
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=1",
            "-m",
            "embodrl.cli",
        ]
    return [*launcher, "train", *job.args, f"run_root={run_root / _slug(job)}"]


def _summary(run_root: Path, job: Job) -> dict:
    """Iterations, seconds per iteration, success and peak GPU memory from the job's run folder."""
    metrics = sorted((run_root / _slug(job)).glob("*/*/metrics.jsonl"))
    if not metrics:
        return {}
    rows = [json.loads(line) for line in metrics[-1].read_text().splitlines() if line.strip()]
    if not rows:
        return {}
    last = rows[-1]
    evals = [r["eval/success"] for r in rows if "eval/success" in r]
    final = metrics[-1].parent / "final_eval.json"
    out = {
        "iterations": last["iteration"],
        "s_per_it": last["time/wall"] / last["iteration"],
        "env_steps_per_s": last.get("rollout/env_steps_per_s"),
        "rollout_success": last.get("rollout/success"),
        "eval_curve": evals,
        "cuda_peak_gib": max((r.get("memory/cuda_peak_gib", 0.0) for r in rows), default=0.0),
    }
    if final.is_file():
        out["final_success"] = json.loads(final.read_text()).get("eval/success")
    return out


def run_job(job: Job, run_root: Path, deadline: float, log) -> dict:
    left = deadline - time.monotonic()
    if left < 20:
        job.result = {"status": "skipped (time budget)"}
        return job.result
    cmd = _command(job, run_root)
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=min(job.timeout, left), env=env)
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        status = f"stopped at its {min(job.timeout, left):.0f} s limit"
        output = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
    job.result = {"status": status, "wall_s": time.monotonic() - start, **_summary(run_root, job)}
    if job.raw:  # a benchmark's own table
        job.result["output"] = output[-4000:]
    log.write(f"\n===== {job.label}: {status}\n$ {' '.join(cmd)}\n{output[-6000:]}\n")
    log.flush()
    print(f"[{time.strftime('%H:%M:%S')}] {job.label}: {status} ({job.result['wall_s']:.0f} s)", flush=True)
    return job.result


def _cell(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def print_table(jobs: list[Job]) -> None:
    print("\n| job | status | wall s | it | s/it | env-steps/s | eval success (curve) | GPU peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for job in jobs:
        r = job.result
        curve = " ".join(f"{x:.2f}" for x in r.get("eval_curve", []))
        final = r.get("final_success")
        success = f"{curve} -> final {final:.2f}" if final is not None else curve
        print(
            f"| {job.label} | {r.get('status', 'not run')} | {_cell(r.get('wall_s'), '.0f')} | "
            f"{_cell(r.get('iterations'), 'd')} | {_cell(r.get('s_per_it'), '.2f')} | "
            f"{_cell(r.get('env_steps_per_s'), ',.0f')} | {success} | "
            f"{_cell(r.get('cuda_peak_gib') or None, '.1f')} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="toy sizes: check the jobs themselves on a CPU")
    parser.add_argument("--demos", help="a LeRobotDataset folder (embodrl collect): SFT before the pick jobs")
    parser.add_argument("--parallel", type=int, default=6, help="check jobs run side by side")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for everything; later jobs skip")
    parser.add_argument("--skip-maniskill", action="store_true", help="no ManiSkill GPU-sim jobs")
    parser.add_argument("--skip-learning", action="store_true", help="checks only (phase 3)")
    parser.add_argument("--out", default="", help="write the results (JSON) and every job's log here")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="cuda_paths_"))
    out.mkdir(parents=True, exist_ok=True)
    run_root = Path(tempfile.mkdtemp(prefix="cuda_paths_runs_"))
    maniskill = args.device.startswith("cuda") and not args.skip_maniskill
    learning, checks = _train_jobs(args.device, args.quick, args.demos, maniskill)
    jobs: list[Job] = []
    with open(out / "jobs.log", "w") as log:
        if maniskill:
            sim = [sys.executable, str(HERE / "adapter_throughput.py"), "--maniskill-gpu"]
            throughput = Job(
                "ManiSkill GPU-sim throughput", [*sim, *(["--quick"] if args.quick else [])], 150
            )
            throughput.raw = True
            jobs.append(throughput)
            run_job(throughput, run_root, deadline, log)
        for job in [] if args.skip_learning else learning:  # alone: their wall-clock is the result
            jobs.append(job)
            run_job(job, run_root, deadline, log)
        jobs += checks
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda j: run_job(j, run_root, deadline, log), checks))
    (out / "results.json").write_text(json.dumps({j.label: j.result for j in jobs}, indent=2))
    print_table(jobs)
    for job in jobs:
        if "output" in job.result:
            print(f"\n{job.label}:\n{job.result['output']}")
    print(f"\nlogs: {out / 'jobs.log'}; run folders: {run_root}")


if __name__ == "__main__":
    main()
