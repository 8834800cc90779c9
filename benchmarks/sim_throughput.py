"""Tabletop env throughput (env-steps/s) against the physics limit, the render limit and gymnasium.

For N in {1, 8, 32, 64}: the VecEnv with state, rgb 64 and rgb 128 observations; (a) raw MuJoCo
stepping of the same model and batch (10 substeps per control step, no IK, no observations),
both `mujoco.batch` and a plain loop, so the faster one is the env's backend; (b) the raw renderer
on the same scene; (c) one env each wrapped in `gymnasium.vector.SyncVectorEnv`.

    python benchmarks/sim_throughput.py            # full table (a few minutes on 2 cores)
    python benchmarks/sim_throughput.py --quick    # fewer steps, N in {1, 8}
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch

from embodrl.sims.config import EnvConfig
from embodrl.sims.tabletop.env import SUBSTEPS, TabletopEnv
from embodrl.sims.tabletop.physics import BatchPhysics, LoopPhysics, default_threads, has_batch

# mujoco is imported inside functions: the tabletop package must pick the headless GL backend first.


def _rate(fn, items_per_call: int, calls: int, repeats: int = 3) -> float:
    """Items per second: the best of `repeats` timings (on a shared machine, the least disturbed one)."""
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
    return items_per_call * calls / best


def env_rate(n: int, calls: int, **obs) -> float:
    env = TabletopEnv(EnvConfig(num_envs=n, **obs))
    gen = torch.Generator().manual_seed(0)
    rate = _rate(lambda: env.step(torch.rand(n, 1, 7, generator=gen) * 2 - 1), n, calls)
    env.close()
    return rate


def raw_physics_rate(n: int, calls: int, backend: type) -> float:
    env = TabletopEnv(EnvConfig(num_envs=n))  # same model, same initial states
    physics = backend(env.model, n, default_threads(0))
    physics.qpos[:], physics.ctrl[:], physics.mocap_pos[:] = (
        env.physics.qpos,
        env.physics.ctrl,
        env.physics.mocap_pos,
    )
    physics.forward()
    return _rate(lambda: physics.step(SUBSTEPS), n, calls)


def raw_render_rate(n: int, calls: int, size: int) -> float:
    import mujoco

    env = TabletopEnv(EnvConfig(num_envs=n))
    renderer = mujoco.Renderer(env.model, size, size)
    datas = [env.physics.data(i, mujoco.MjData(env.model)) for i in range(n)]
    if isinstance(env.physics, LoopPhysics):  # its data() returns live datas, not copies
        datas = [mujoco.MjData(env.model) for _ in range(n)]
        for i, d in enumerate(datas):
            d.qpos[:], d.mocap_pos[:] = env.physics.qpos[i], env.physics.mocap_pos[i]
            mujoco.mj_forward(env.model, d)

    def render_all() -> None:
        for d in datas:
            renderer.update_scene(d, "front")
            for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION):
                renderer.scene.flags[flag] = 0
            renderer.render()

    rate = _rate(render_all, n, calls)
    renderer.close()
    return rate


class SingleTabletop(gym.Env):
    """One tabletop env behind the gymnasium API, as a user would wrap it without batching."""

    def __init__(self, **obs):
        self.env = TabletopEnv(EnvConfig(num_envs=1, **obs))
        self.rgb = obs.get("obs_mode") == "rgb"
        self.action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        size = self.env.cfg.image_size
        self.observation_space = (
            gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
            if self.rgb
            else gym.spaces.Box(-np.inf, np.inf, (self.env.observation_spec["state"].shape[0],), np.float32)
        )

    def _obs(self, td):
        return td["rgb"][0].numpy() if self.rgb else td["state"][0].numpy()

    def reset(self, seed=None, options=None):
        return self._obs(self.env.reset(seed=seed)), {}

    def step(self, action):
        res = self.env.step(torch.as_tensor(action, dtype=torch.float32).view(1, 1, 7))
        return (
            self._obs(res.obs),
            float(res.reward[0, 0]),
            bool(res.terminated[0]),
            bool(res.truncated[0]),
            {},
        )


def gym_rate(n: int, calls: int, **obs) -> float:
    vec = gym.vector.SyncVectorEnv(
        [lambda: SingleTabletop(**obs) for _ in range(n)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    vec.reset(seed=0)
    rng = np.random.default_rng(0)
    rate = _rate(lambda: vec.step(rng.uniform(-1, 1, (n, 7)).astype(np.float32)), n, calls)
    vec.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and N in {1, 8}")
    parser.add_argument("--maniskill", action="store_true", help="add ManiSkill3 push/pick rows")
    args = parser.parse_args()
    import mujoco

    sizes = (1, 8) if args.quick else (1, 8, 32, 64)
    state_steps, rgb_steps = (10, 3) if args.quick else (60, 10)
    batch_name = "mujoco.batch" if has_batch() else "(no mujoco.batch)"
    print(f"mujoco {mujoco.__version__}, {default_threads(0)} threads, env-steps/s (control steps of 0.05 s)")
    header = (
        f"| N | env state | (a) raw {batch_name} | (a) raw loop | state/(a) | (c) gym sync state | "
        "env rgb64 | (b) render64 | rgb64/(b) | (c) gym rgb64 | env rgb128 | (b) render128 | rgb128/(b) |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for n in sizes:
        calls = max(3, state_steps * 8 // n)
        rgb_calls = max(2, rgb_steps * 8 // n)
        state = env_rate(n, calls)
        raw_batch = raw_physics_rate(n, calls, BatchPhysics) if has_batch() else float("nan")
        raw_loop = raw_physics_rate(n, calls, LoopPhysics)
        gym_state = gym_rate(n, calls)
        row = [state, raw_batch, raw_loop, state / np.nanmax([raw_batch, raw_loop]), gym_state]
        for size in (64, 128):
            rgb = env_rate(n, rgb_calls, obs_mode="rgb", image_size=size)
            render = raw_render_rate(n, rgb_calls, size)
            row += [rgb, render, rgb / render]
            if size == 64:
                row.append(gym_rate(n, rgb_calls, obs_mode="rgb", image_size=size))
        cells = [f"{v:.2f}" if 0 < v < 10 else f"{v:,.0f}" for v in row]
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)
    if args.maniskill:
        from adapter_throughput import maniskill_table  # benchmarks/ is on sys.path when run as a script

        maniskill_table(args.quick)


if __name__ == "__main__":
    main()
