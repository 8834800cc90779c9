"""SAC on gymnasium Pendulum-v1: embodrl (algo=sac) beside stable-baselines3's SAC, matched settings.

Both train for the same env steps on one env with plain SAC's settings: update-to-data ratio 1 (one
gradient step per env step, the actor and temperature each step too), 2 critics (the target's minimum
over both), batch 256, Adam lr 3e-4, gamma 0.99, tau 0.005, temperature tuned from 1 toward entropy
-|A|, 256x256 ReLU actor and critics, `--learning-starts` steps of uniform random actions first.
What differs is what each library does by design: embodrl's critics carry LayerNorm (RLPD) and its
actor maximizes the critics' mean Q (RLPD/REDQ), SB3's critics have none and its actor maximizes the
minimum; SB3 clamps the log-std to [-20, 2], embodrl to [-5, 2].

"Return" is the mean undiscounted return of the final deterministic policy on 10 episodes of a fresh
Pendulum-v1 seeded 1000..1009, the same function for both. "Wall" is the training loop alone: SB3's
`learn()`, embodrl's summed iteration times (rollouts and updates; checkpoints and evaluation excluded).
stable-baselines3 comes from the `bench` extra (`pip install -e .[bench]`).

    python benchmarks/sac_vs_sb3.py                         # 10000 steps x 2 seeds: ~20 minutes on 2 cores
    python benchmarks/sac_vs_sb3.py --steps 2000 --seeds 1  # a quick look
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from embodrl.config import compose
from embodrl.policies.loading import load_policy
from embodrl.train.checkpointing import LAST, POLICY_DIR
from embodrl.train.logger import read_metrics
from embodrl.train.offpolicy_runner import OffPolicyRunner

ENV_ID, EPISODE_STEPS = "Pendulum-v1", 200
EVAL_EPISODES, EVAL_SEED = 10, 1000


@dataclass(frozen=True)
class Result:
    library: str
    seed: int
    final_return: float
    wall_s: float


def mean_return(act: Callable[[np.ndarray], np.ndarray]) -> float:
    """The deterministic policy `act` (observation -> action in env units) on the evaluation episodes."""
    env = gym.make(ENV_ID)
    returns = []
    for episode in range(EVAL_EPISODES):
        obs, _ = env.reset(seed=EVAL_SEED + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return statistics.mean(returns)


def run_embodrl(steps: int, learning_starts: int, seed: int, workdir: Path) -> Result:
    overrides = [
        f"seed={seed}",
        f"env.seed={seed}",
        f"train.iterations={steps // EPISODE_STEPS}",
        "train.eval_every=0",
        "train.eval_episodes=1",
        "train.save_every=1000000",
        "train.keep_best=false",
        "train.tensorboard=false",
        "algo.utd=1",
        "algo.num_critics=2",
        "algo.critic_subset=2",
        f"algo.learning_starts={learning_starts}",
    ]
    run_dir = workdir / f"embodrl-{seed}"
    run_dir.mkdir()
    OffPolicyRunner(compose("sac_pendulum", overrides), run_dir).learn()
    wall = read_metrics(run_dir)[-1]["time/wall"]
    policy = load_policy(run_dir / LAST / POLICY_DIR)
    scale = 2.0  # Pendulum's torque bound: the adapter maps [-1, 1] onto [-2, 2]

    def act(obs: np.ndarray) -> np.ndarray:
        state = torch.as_tensor(obs, dtype=torch.float32)[None]
        out = policy.act(TensorDict({"state": state}, batch_size=[1]), deterministic=True)
        return scale * out.actions[0, 0].numpy()

    return Result("embodrl", seed, mean_return(act), wall)


def run_sb3(steps: int, learning_starts: int, seed: int) -> Result:
    from stable_baselines3 import SAC

    model = SAC(
        "MlpPolicy",
        gym.make(ENV_ID),
        learning_starts=learning_starts,
        batch_size=256,
        learning_rate=3e-4,
        gamma=0.99,
        tau=0.005,
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto",
        policy_kwargs={"net_arch": [256, 256]},
        seed=seed,
        device="cpu",
    )
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    wall = time.perf_counter() - start
    return Result(
        "stable-baselines3", seed, mean_return(lambda obs: model.predict(obs, deterministic=True)[0]), wall
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10000, help="env steps per run (whole episodes)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds 0..n-1 per library")
    parser.add_argument(
        "--learning-starts", type=int, default=1000, help="random-action steps before updates"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both libraries alike")
    args = parser.parse_args()
    steps = max(1, args.steps // EPISODE_STEPS) * EPISODE_STEPS
    torch.set_num_threads(args.threads)
    print(f"{ENV_ID}: {steps} env steps, UTD 1, {args.seeds} seed(s), {args.threads} torch thread(s)")
    results = []
    with tempfile.TemporaryDirectory(prefix="embodrl-sac-sb3-") as workdir:
        for seed in range(args.seeds):
            for result in (
                run_embodrl(steps, args.learning_starts, seed, Path(workdir)),
                run_sb3(steps, args.learning_starts, seed),
            ):
                results.append(result)
                line = f"return {result.final_return:.1f}, wall {result.wall_s:.1f} s"
                print(f"{result.library} seed {seed}: {line}", flush=True)
    print("\n| library | seeds | final return (mean, per seed) | wall-clock s (mean) |")
    print("|---|---|---|---|")
    for library in ("embodrl", "stable-baselines3"):
        mine = [r for r in results if r.library == library]
        per_seed = ", ".join(f"{r.final_return:.0f}" for r in mine)
        print(
            f"| {library} | {len(mine)} | {statistics.mean(r.final_return for r in mine):.0f} ({per_seed}) | "
            f"{statistics.mean(r.wall_s for r in mine):.0f} |"
        )


if __name__ == "__main__":
    main()
