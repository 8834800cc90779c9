"""How much a frozen flow policy's success depends on its initial noise: the room noise-space RL (DSRL,
`algo.noise_policy`) has to steer it. Plays the policy's deterministic ODE (`Policy.act_from_noise`) on
the experiment's evaluation states (ids 0..episodes-1) from

  - the same constant noise at every decision, for each value of --constants;
  - fresh N(0, I) noise at every decision, under --seeds torch seeds; then how many states some seed
    solves, how many every seed solves, and the histogram of per-state successes.

    python scripts/flow_noise_leverage.py RUN/sft/checkpoints/last/policy             # pick_dsrl's env
    python scripts/flow_noise_leverage.py CHECKPOINT --experiment X --constants -1.5 0 1.5 --seeds 6
"""

from __future__ import annotations

import argparse
import time

import torch

from embodrl.config import compose
from embodrl.policies.loading import load_policy
from embodrl.sims.registry import make_env
from embodrl.train.episodes import run_episodes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", help="a flow policy's checkpoint folder")
    parser.add_argument("--experiment", default="pick_dsrl", help="whose env to play in (default pick_dsrl)")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--envs", type=int, default=50)
    parser.add_argument("--constants", type=float, nargs="*", default=[0.0, -1.5, -0.75, 0.75, 1.5])
    parser.add_argument("--seeds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    policy = load_policy(args.checkpoint).eval()
    shape = policy.noise_shape
    env = make_env(compose(args.experiment, [f"env.num_envs={args.envs}"]).env)
    start = time.perf_counter()

    def success(noise) -> list[bool]:
        results = run_episodes(
            env, lambda obs: policy.act_from_noise(obs, noise(obs.batch_size[0])), args.episodes
        )
        return [bool(s) for s in results.success]

    for value in args.constants:
        solved = success(lambda n, value=value: torch.full((n, *shape), value))
        elapsed = time.perf_counter() - start
        print(f"constant noise {value:+.2f}: {sum(solved)}/{args.episodes} ({elapsed:.0f} s)")
    per_state = torch.zeros(args.episodes, dtype=torch.long)
    for seed in range(args.seeds):
        torch.manual_seed(seed)
        solved = success(lambda n: torch.randn(n, *shape))
        per_state += torch.tensor(solved, dtype=torch.long)
        print(
            f"N(0, I) noise, seed {seed}: {sum(solved)}/{args.episodes} ({time.perf_counter() - start:.0f} s)"
        )
    if args.seeds:
        print(
            f"states solved under some seed: {int((per_state > 0).sum())}, under every seed: "
            f"{int((per_state == args.seeds).sum())}; states by how many seeds solve them (0..{args.seeds}): "
            f"{torch.bincount(per_state, minlength=args.seeds + 1).tolist()}"
        )
    env.close()


if __name__ == "__main__":
    main()
