"""Adapter throughput (env-steps/s): ManiSkill3 and LIBERO beside the tabletop suite on push/pick.

Each row steps the embodrl VecEnv with random 7-D actions (chunk 1, one CPU core's worth of envs
in turn). ManiSkill also gets its raw env (no adapter) so the adapter's overhead shows; it needs
the Vulkan driver (`make maniskill-cpu`, then `. .cache/vulkan-lvp/env.sh`). LIBERO runs only in
its own venv (`make libero-venv`), so it has its own flag. On a CUDA machine, --maniskill-gpu steps
ManiSkill's GPU simulation (physx_cuda: one env holds all N sub-envs, tensors stay on the GPU) for
growing N, raw and through the adapter:

    python benchmarks/adapter_throughput.py --maniskill          # in .venv
    .venv-libero/bin/python benchmarks/adapter_throughput.py --libero
    python benchmarks/adapter_throughput.py --maniskill-gpu      # needs CUDA and the NVIDIA Vulkan driver
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env

# (embodrl suite, task) pairs doing the same thing: push a cube to a goal, pick a cube up.
MANISKILL_ROWS = [("push", "PushCube-v1", "push"), ("pick", "PickCube-v1", "pick")]
LIBERO_ROWS = [("pick-place", "libero-spatial", "0")]


def _rate(step, items: int, calls: int) -> float:
    step()  # warm-up
    start = time.perf_counter()
    for _ in range(calls):
        step()
    return items * calls / (time.perf_counter() - start)


def vecenv_rate(cfg: EnvConfig, calls: int, device: str = "cpu") -> float:
    env = make_env(cfg, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    dim = env.action_spec.dim
    rate = _rate(
        lambda: env.step(torch.rand(cfg.num_envs, 1, dim, generator=gen, device=device) * 2 - 1),
        cfg.num_envs,
        calls,
    )
    env.close()
    return rate


def raw_maniskill_rate(
    task: str, obs_mode: str, size: int, calls: int, num_envs: int = 1, sim_backend: str = "physx_cpu"
) -> float:
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401 (registers the tasks)

    env = gym.make(
        task,
        num_envs=num_envs,
        obs_mode=obs_mode,
        control_mode="pd_ee_delta_pose",
        sim_backend=sim_backend,
        sensor_configs={"width": size, "height": size},
    )
    env.reset(seed=0)
    rate = _rate(lambda: env.step(env.action_space.sample()), num_envs, calls)
    env.close()
    return rate


def maniskill_table(quick: bool) -> None:
    import mani_skill

    calls = 20 if quick else 100
    print(f"\nmani_skill {mani_skill.__version__} (CPU physx, pd_ee_delta_pose), env-steps/s, N=2")
    print(
        "| task | tabletop state | ManiSkill state | raw ManiSkill state | tabletop rgb64 | ManiSkill rgb64 |"
    )
    print("|---|---|---|---|---|---|")
    for name, ms_task, tt_task in MANISKILL_ROWS:
        ms = dict(suite="maniskill", task=ms_task, num_envs=2, max_episode_steps=50)
        tt = dict(suite="tabletop-basic", task=tt_task, num_envs=2, max_episode_steps=50)
        row = [
            vecenv_rate(EnvConfig(**tt), calls),
            vecenv_rate(EnvConfig(**ms), calls),
            raw_maniskill_rate(ms_task, "state_dict", 64, calls),
            vecenv_rate(EnvConfig(**tt, obs_mode="rgb"), calls // 4),
            vecenv_rate(EnvConfig(**ms, obs_mode="rgb"), calls // 4),
        ]
        print(f"| {name} ({ms_task}) | " + " | ".join(f"{v:,.1f}" for v in row) + " |", flush=True)


def _gpu_cell(task: str, obs_mode: str, size: int, num_envs: int, calls: int, adapter: bool) -> float:
    """One ManiSkill GPU-sim rate in a fresh process: PhysX's GPU simulation starts once per process."""
    cmd = [sys.executable, __file__, "--gpu-cell", task, obs_mode, str(size), str(num_envs), str(calls)]
    out = subprocess.run(cmd + ["--adapter"] * adapter, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def gpu_cell_rate(task: str, obs_mode: str, size: int, num_envs: int, calls: int, adapter: bool) -> float:
    if not adapter:
        return raw_maniskill_rate(task, obs_mode, size, calls, num_envs, sim_backend="physx_cuda")
    cfg = EnvConfig(
        suite="maniskill",
        task=task,
        num_envs=num_envs,
        max_episode_steps=50,
        obs_mode="rgb" if obs_mode == "rgb" else "state",
        image_size=size,
    )
    return vecenv_rate(cfg, calls, device="cuda")


def maniskill_gpu_table(quick: bool) -> None:
    import mani_skill

    calls = 10 if quick else 50
    rows = [("state_dict", 64, 1024), ("state_dict", 64, 4096), ("rgb", 128, 256)]
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    print(f"\nmani_skill {mani_skill.__version__} on {name} (physx_cuda, pd_ee_delta_pose), env-steps/s")
    print("| task | obs | N | raw ManiSkill | embodrl VecEnv | adapter / raw |")
    print("|---|---|---|---|---|---|")
    task = "PickCube-v1"
    for obs_mode, size, n in rows:
        raw, ours = (_gpu_cell(task, obs_mode, size, n, calls, adapter) for adapter in (False, True))
        label = f"rgb {size}" if obs_mode == "rgb" else "state"
        print(f"| {task} | {label} | {n} | {raw:,.0f} | {ours:,.0f} | {ours / raw:.2f} |", flush=True)


def libero_table(quick: bool) -> None:
    calls = 3 if quick else 10
    print("\nLIBERO (robosuite OSC_POSE, 20 Hz) beside the tabletop suite, env-steps/s, N=1")
    print("| task | tabletop state | LIBERO state | tabletop rgb128 | LIBERO rgb128 (agentview + wrist) |")
    print("|---|---|---|---|---|")
    for name, suite, task in LIBERO_ROWS:
        lib = dict(suite=suite, task=task, num_envs=1, max_episode_steps=1000)
        tt = dict(suite="tabletop-basic", task="place", num_envs=1, max_episode_steps=1000)
        rgb = dict(obs_mode="rgb", image_size=128, wrist_camera=True)
        row = [
            vecenv_rate(EnvConfig(**tt), calls * 10),
            vecenv_rate(EnvConfig(**lib), calls),
            vecenv_rate(EnvConfig(**tt, **rgb), calls),
            vecenv_rate(EnvConfig(**lib, **rgb), calls),
        ]
        print(f"| {name} ({suite} task {task}) | " + " | ".join(f"{v:,.1f}" for v in row) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maniskill", action="store_true", help="ManiSkill3 rows (needs Vulkan)")
    parser.add_argument("--libero", action="store_true", help="LIBERO rows (run in .venv-libero)")
    parser.add_argument("--maniskill-gpu", action="store_true", help="ManiSkill3 GPU simulation (CUDA)")
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--gpu-cell", nargs=5, help=argparse.SUPPRESS)  # task obs size N calls (internal)
    parser.add_argument("--adapter", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gpu_cell:
        task, obs_mode, size, num_envs, calls = args.gpu_cell
        print(gpu_cell_rate(task, obs_mode, int(size), int(num_envs), int(calls), args.adapter))
        return
    if not (args.maniskill or args.libero or args.maniskill_gpu):
        parser.error("choose --maniskill, --maniskill-gpu and/or --libero")
    if args.maniskill:
        maniskill_table(args.quick)
    if args.maniskill_gpu:
        maniskill_gpu_table(args.quick)
    if args.libero:
        libero_table(args.quick)


if __name__ == "__main__":
    main()
