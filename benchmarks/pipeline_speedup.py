"""Rollout engine speedups: sequential vs pipelined (K=2, K=4, or `--stages`) vs async, on tabletop rgb.

For each schedule: seconds per rollout of T decisions x N envs (best of R, timed in turns), the stage timers
(t_sim: env stepping and rendering inside the env worker; t_inf: policy inference), and the
end-to-end env-steps/s of a training loop (rollout + PPO update + weight push), where the async
schedule overlaps the next rollout with the update, and the same for `embodrl train` itself (a run
per schedule, `--cli-iterations`); GRPO presets train on every group (success filter off), so their
updates cost what they do once a policy learns (GRPO scores whole episodes: keep T x chunk at least the
episode length, T >= 10 for the OFT preset). The ideal pipelined speedup is
(t_sim + t_inf) / max(t_sim, t_inf) with t_sim, t_inf from the sequential run; "of bound" is each
schedule's busiest stage over its rollout time, how close it came to the stage that bounds it.

    python benchmarks/pipeline_speedup.py            # N=8, T=10, rgb 128, Gaussian CNN policy
    python benchmarks/pipeline_speedup.py --quick    # N=4 (a GRPO preset: one group), T=5, rgb 64
    python benchmarks/pipeline_speedup.py --experiment pi0_flow_noise_nano     # the nano pi0 VLA
    python benchmarks/pipeline_speedup.py --experiment openvla_oft_grpo_nano   # the nano OpenVLA-OFT
    python benchmarks/pipeline_speedup.py --experiment openvla_oft_grpo_nano --image-size 128 \
        --patch-size 16                                   # ... built for rgb 128 (64 image tokens)
    python benchmarks/pipeline_speedup.py --device cuda --num-envs 32          # inference on a GPU
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import queue
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from embodrl.algos.ppo import PPO
from embodrl.config import compose
from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.engine.env_client import StagedEnv
from embodrl.engine.schedules import make_schedule
from embodrl.train.policy_setup import build_policy


def modes(stages: list[int]) -> dict[str, list[str]]:
    """label -> engine overrides: sequential, pipelined for each K in `stages`, and the first K over the
    multiprocess transport and under the async schedule."""
    pipelined = {f"pipelined K={k}": ["engine.schedule=pipelined", f"engine.num_stages={k}"] for k in stages}
    first = f"engine.num_stages={stages[0]}"
    return {
        "sequential": ["engine.schedule=sequential"],
        **pipelined,
        f"pipelined K={stages[0]} mp": ["engine.schedule=pipelined", first, "engine.transport=multiprocess"],
        f"async K={stages[0]}": ["engine.schedule=async", first, "engine.max_staleness=1"],
    }


def experiment(args, engine: list[str]):
    """The Gaussian CNN on tabletop-basic rgb, or a preset (a VLA with its language suite), with the
    benchmark's image size, env count and engine."""
    return compose(args.experiment or None, overrides(args, engine))


def overrides(args, engine: list[str]) -> list[str]:
    """`experiment`'s overrides of the preset (or of the defaults, for the CNN)."""
    size = [f"env.image_size={args.image_size}"] if args.image_size else []  # else the preset's own
    common = [
        "env.obs_mode=rgb",
        *size,
        f"env.num_envs={args.num_envs}",
        "env.num_threads=1",
        "algo.num_epochs=1",
        "algo.critic_warmup_iters=0",
        # GRPO trains on every group, as once a policy succeeds at times: a fresh policy never succeeds,
        # and the success filter would drop all its groups, leaving updates that cost nothing
        "algo.grpo_success_range=null",
        f"device={args.device}",
        *engine,
    ]
    if args.experiment:  # a VLA preset's towers are built for the benchmark's images
        towers = [f"policy.vla.image_size={args.image_size}"] if args.image_size else []
        towers += [f"policy.vla.patch_size={args.patch_size}"] if args.patch_size else []
        return [*common, *towers]
    cnn = [
        "env.suite=tabletop-basic",
        "policy.family=gaussian",
        "policy.obs_keys=[rgb,state]",
        "policy.chunk_size=1",
        f"policy.cnn_channels={args.channels}",
    ]
    return [*cnn, *common]


class Setup:
    """One schedule with its own env worker, policy and PPO, measured in turns with the others."""

    def __init__(self, args, engine: list[str]) -> None:
        self.engine = engine  # the overrides, for the `embodrl train` run of the same schedule
        self.cfg = cfg = experiment(args, engine)
        self.env = StagedEnv(cfg.env, cfg.engine, device=cfg.device)
        torch.manual_seed(0)
        self.policy = build_policy(cfg, self.env)
        self.schedule = make_schedule(
            cfg.engine,
            self.env,
            self.policy,
            RolloutBuffer(args.steps, args.num_envs, device=cfg.device),
            cfg.device,
        )
        self.algo = PPO(self.policy, cfg.algo)
        self.schedule.push_weights(self.policy, 0)
        self.best, self.timings = float("inf"), {}

    def states(self) -> torch.Tensor:
        return torch.arange(self.env.num_envs)

    def time_rollout(self) -> None:
        start = time.perf_counter()
        rollout = self.schedule.collect(self.states)
        seconds = time.perf_counter() - start
        if seconds < self.best:
            self.best, self.timings = seconds, rollout.timings

    def train_rate(self, iterations: int) -> float:
        """Env-steps/s (C executed actions per decision) of `iterations` x (rollout, update, weight push)."""
        gen, steps = torch.Generator().manual_seed(0), 0
        start = time.perf_counter()
        for version in range(iterations):
            rollout = self.schedule.collect(self.states)
            steps += int(rollout.buffer.data["steps_executed"].sum())
            self.algo.update(rollout.buffer, version, gen)
            self.schedule.push_weights(self.policy, version + 1)
        rate = steps / (time.perf_counter() - start)
        self.schedule.close()
        self.env.close()
        return rate


def measure(args) -> dict[str, dict[str, float]]:
    """Rollouts timed in turns (round-robin), so a busy spell of the machine hits every schedule alike."""
    setups = {label: Setup(args, engine) for label, engine in modes(args.stages).items()}
    timed = [s for label, s in setups.items() if not label.startswith("async")]  # async needs an update
    for setup in timed:
        setup.time_rollout()  # warm-up: renderer contexts, allocator
        setup.best = float("inf")
    for _ in range(args.repeats):
        for setup in timed:
            setup.time_rollout()
    return {
        label: {
            "rollout_s": s.best,
            "t_sim": s.timings.get("env_step", float("nan")),
            "t_inf": s.timings.get("inference", float("nan")),
            "steps_per_s": s.train_rate(args.iterations),
            "cli_steps_per_s": cli_rate(args, s.engine) if args.cli_iterations else 0.0,
        }
        for label, s in setups.items()
    }


def cli_rate(args, engine: list[str]) -> float:
    """Env-steps/s of `embodrl train` itself with this engine, in its own process, evaluation off: its
    metrics.jsonl's env steps over its time/wall (rollouts and updates), after the first iteration."""
    with tempfile.TemporaryDirectory() as run_root:
        train = [
            f"train.iterations={args.cli_iterations}",
            f"train.rollout_steps={args.steps}",
            "train.eval_every=0",
            "train.eval_episodes=1",
            "train.videos=0",
            "train.keep_best=false",
            "train.torch_threads=1",
            f"run_root={run_root}",
        ]
        preset = [args.experiment] if args.experiment else []
        command = [sys.executable, "-m", "embodrl.cli", "train", *preset, *overrides(args, engine), *train]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"embodrl train failed ({' '.join(command[4:])}):\n{done.stderr[-3000:]}")
        (metrics_file,) = Path(run_root).glob("*/*/metrics.jsonl")
        rows = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    first, last = rows[0], rows[-1]
    return (last["rollout/env_steps"] - first["rollout/env_steps"]) / (last["time/wall"] - first["time/wall"])


def stage_alone(kind: str, args, barrier, results, seconds: float) -> None:
    """One stage of the sequential rollout in a process of its own, looped for `seconds`: T steps of the
    N envs ("sim", zero-copy: the env answers in this process) or T decisions of the policy on N envs
    ("inf"). Puts (kind, seconds per loop) on `results`."""
    torch.set_num_threads(1)
    cfg = experiment(args, ["engine.transport=inline"])
    env = StagedEnv(cfg.env, cfg.engine, device=cfg.device)
    torch.manual_seed(0)
    policy = build_policy(cfg, env).eval()
    obs = env.reset_to(torch.arange(env.num_envs))
    with torch.inference_mode():
        actions = policy.act(obs).actions

    def loop() -> None:
        with torch.inference_mode():
            for _ in range(args.steps):
                if kind == "sim":
                    env.step(actions)
                else:
                    policy.act(obs)

    loop()  # warm-up
    barrier.wait()
    loops, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        loop()
        loops += 1
    results.put((kind, (time.perf_counter() - start) / loops))
    barrier.wait()  # the other stage keeps its load on until both are done
    env.close()


def next_result(results, procs: list) -> tuple[str, float]:
    """The next probe's (kind, seconds); raises as soon as a probe process fails (its error is above),
    stopping the other, which would wait for it at the barrier."""
    while True:
        try:
            return results.get(timeout=1.0)
        except queue.Empty:
            failed = [proc for proc in procs if proc.exitcode not in (None, 0)]
            if failed:
                for proc in procs:
                    proc.terminate()
                raise RuntimeError(
                    f"a probe process exited with code {failed[0].exitcode} (its error is above); "
                    "--overlap-s 0 skips the probe"
                ) from None


def machine_overlap(args) -> dict[str, float]:
    """The stages' seconds alone and side by side in two processes that share nothing: how much the
    machine itself (cores, caches, memory, the renderer's threads) slows each stage when the other runs,
    with no engine between. Both stay busy throughout; in a pipeline each side also waits at times, so
    the ceiling these slowdowns give is a rough, low one."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    seconds: dict[str, float] = {}
    for kinds in (["sim"], ["inf"], ["sim", "inf"]):
        barrier = ctx.Barrier(len(kinds))
        procs = [
            ctx.Process(target=stage_alone, args=(k, args, barrier, results, args.overlap_s)) for k in kinds
        ]
        for proc in procs:
            proc.start()
        for _ in kinds:
            kind, per_loop = next_result(results, procs)
            seconds[kind + ("_together" if len(kinds) == 2 else "_alone")] = per_loop
        for proc in procs:
            proc.join()
    return seconds


def overlapped_speedup(t_sim: float, t_inf: float, slow_sim: float = 1.0, slow_inf: float = 1.0) -> float:
    """Sequential time over perfectly overlapped time, (t_sim + t_inf) / max(t_sim, t_inf), with each
    stage slowed by its factor while the other runs (1: the ideal)."""
    return (t_sim + t_inf) / max(t_sim * slow_sim, t_inf * slow_inf)


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument(
        "--quick", action="store_true", help="N=4 (a GRPO preset: one group), T=5, rgb 64, fewer repeats"
    )
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10, help="decisions per rollout (T)")
    parser.add_argument(
        "--image-size",
        type=int,
        default=0,
        help="rgb size; default 128 for the CNN, the preset's for --experiment",
    )
    parser.add_argument(
        "--patch-size", type=int, default=0, help="a VLA's ViT patch size (default: the preset's)"
    )
    parser.add_argument("--channels", default="[32,64,64,64]", help="CNN widths: the inference cost")
    parser.add_argument(
        "--experiment", default="", help="a preset to measure instead of the CNN, e.g. pi0_flow_noise_nano"
    )
    parser.add_argument("--device", default="cpu", help="where the policy infers and trains (cuda on a GPU)")
    parser.add_argument(
        "--stages",
        type=int,
        nargs="+",
        default=[2, 4],
        help="pipeline stages K to measure (the first K also multiprocess and async)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=4, help="rollout + update loops for env-steps/s")
    parser.add_argument(
        "--cli-iterations",
        type=int,
        default=4,
        help="iterations of `embodrl train` per schedule for its env-steps/s (0: skip; else at least 2)",
    )
    parser.add_argument(
        "--overlap-s",
        type=float,
        default=8.0,
        help="seconds each stage loops, alone and beside the other, for the machine's ceiling (0: skip)",
    )
    args = parser.parse_args()
    if args.cli_iterations == 1:
        parser.error("--cli-iterations must be 0 (skip) or at least 2: the first iteration is warm-up")
    if args.quick:
        args.num_envs, args.steps, args.image_size, args.repeats, args.iterations = 4, 5, 64, 2, 2
        algo = compose(args.experiment, []).algo if args.experiment else None
        if algo is not None and algo.name == "grpo":  # whole groups
            args.num_envs = max(args.num_envs, algo.group_size)
        args.cli_iterations = min(args.cli_iterations, 2)
        args.overlap_s = min(args.overlap_s, 3.0)
    torch.set_num_threads(1)  # one core infers while the env worker steps on the other
    if not args.image_size and not args.experiment:
        args.image_size = 128
    overlap = machine_overlap(args) if args.overlap_s > 0 else {}
    results = measure(args)
    seq = results["sequential"]
    ideal = overlapped_speedup(seq["t_sim"], seq["t_inf"])
    ceiling = float("nan")
    if overlap:  # the ideal with each stage slowed as much as its neighbour slowed it in the probe
        slow_sim = max(1.0, overlap["sim_together"] / overlap["sim_alone"])  # faster beside it: noise
        slow_inf = max(1.0, overlap["inf_together"] / overlap["inf_alone"])
        ceiling = overlapped_speedup(seq["t_sim"], seq["t_inf"], slow_sim, slow_inf)
    what = args.experiment or f"Gaussian CNN {args.channels} on tabletop-basic"
    size = experiment(args, []).env.image_size
    print(
        f"{what}, rgb {size}, N={args.num_envs} envs, T={args.steps} decisions, policy on {args.device}; "
        f"sequential t_sim={seq['t_sim']:.3f}s t_inf={seq['t_inf']:.3f}s; ideal speedup {ideal:.2f}x"
    )
    if overlap:
        print(
            f"the machine's overlap (each stage in a process): t_sim {overlap['sim_alone']:.3f}s alone, "
            f"{overlap['sim_together']:.3f}s beside inference; t_inf {overlap['inf_alone']:.3f}s alone, "
            f"{overlap['inf_together']:.3f}s beside simulation; "
            f"ceiling {ceiling:.2f}x (the ideal with these slowdowns)"
        )
    header = f"{'schedule':<18}{'rollout s':>11}{'t_sim s':>9}{'t_inf s':>9}{'speedup':>9}{'of ideal':>10}"
    cli = f"{'embodrl train':>15}{'vs seq':>8}" if args.cli_iterations else ""
    print(header + f"{'of ceiling':>12}{'of bound':>10}{'train env-steps/s':>19}{'vs seq':>8}{cli}")
    for label, r in results.items():
        if r["rollout_s"] < float("inf"):
            speedup = seq["rollout_s"] / r["rollout_s"]
            of_ideal = "" if label == "sequential" else f"{speedup / ideal:.0%}"
            of_ceiling = "" if label == "sequential" or not overlap else f"{speedup / ceiling:.0%}"
            # a rollout is never shorter than its busiest stage, as that stage ran in this schedule
            # (split batches can be faster per env than the sequential one, lifting "of ideal" over 100%)
            bound = max(r["t_sim"], r["t_inf"]) / r["rollout_s"]
            of_bound = "" if label == "sequential" else f"{bound:.0%}"
            times = f"{r['rollout_s']:>11.3f}{r['t_sim']:>9.3f}{r['t_inf']:>9.3f}"
            rollout = f"{times}{speedup:>8.2f}x{of_ideal:>9}{of_ceiling:>12}{of_bound:>10}"
        else:  # async: its rollouts overlap the updates, so only the training rate compares
            rollout = f"{'-':>11}{'-':>9}{'-':>9}{'-':>9}{'':>9}{'':>12}{'':>10}"
        train = f"{r['steps_per_s']:>18.1f}{r['steps_per_s'] / seq['steps_per_s']:>7.2f}x"
        if args.cli_iterations:
            train += f"{r['cli_steps_per_s']:>15.1f}{r['cli_steps_per_s'] / seq['cli_steps_per_s']:>7.2f}x"
        print(f"{label:<18}{rollout} {train}")


if __name__ == "__main__":
    main()
