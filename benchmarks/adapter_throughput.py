"""Adapter throughput (env-steps/s): ManiSkill3 and LIBERO beside the tabletop suite on push/pick.

Each row steps the embodrl VecEnv with random 7-D actions (chunk 1, one CPU core's worth of envs
in turn). ManiSkill also gets its raw env (no adapter) so the adapter's overhead shows; it needs
the Vulkan driver (`make maniskill-cpu`, then `. .cache/vulkan-lvp/env.sh`). LIBERO runs only in
its own venv (`make libero-venv`), so it has its own flag:

    python benchmarks/adapter_throughput.py --maniskill          # in .venv
    .venv-libero/bin/python benchmarks/adapter_throughput.py --libero
"""

from __future__ import annotations

import argparse
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


def vecenv_rate(cfg: EnvConfig, calls: int) -> float:
    env = make_env(cfg)
    gen = torch.Generator().manual_seed(0)
    dim = env.action_spec.dim
    rate = _rate(
        lambda: env.step(torch.rand(cfg.num_envs, 1, dim, generator=gen) * 2 - 1), cfg.num_envs, calls
    )
    env.close()
    return rate


def raw_maniskill_rate(task: str, obs_mode: str, size: int, calls: int) -> float:
    import gymnasium as gym

    env = gym.make(
        task,
        num_envs=1,
        obs_mode=obs_mode,
        control_mode="pd_ee_delta_pose",
        sim_backend="physx_cpu",
        sensor_configs={"width": size, "height": size},
    )
    env.reset(seed=0)
    rate = _rate(lambda: env.step(env.action_space.sample()), 1, calls)
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
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    args = parser.parse_args()
    if not (args.maniskill or args.libero):
        parser.error("choose --maniskill and/or --libero")
    if args.maniskill:
        maniskill_table(args.quick)
    if args.libero:
        libero_table(args.quick)


if __name__ == "__main__":
    main()
