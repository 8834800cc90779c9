"""Where does an off-policy run's critic overestimate? Q against its TD target on the run's own replay data.

Loads an off-policy run's checkpoints/last (the critics, their targets, the actor and both replay buffers,
as `--resume` does; nothing is written) and, for the online buffer and the demo buffer separately, prints
the transitions' reward / termination counts (a reward without a termination bootstraps past a success)
and, for the rows that end in a success and for the others: the critics' mean Q(s, a), the TD target,
Q(s, pi(s)) (what the actor gains on the critics over the data's actions: the per-step overestimate that
bootstrapping compounds to about gain / (1 - gamma)) and the ensemble's spread (the pessimism the
target's min can bring).

    python scripts/diagnose_sac_q.py runs/pick_image_sac/RUN
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from embodrl.config import compose
from embodrl.data.replay_buffer import ReplayBuffer
from embodrl.train.offpolicy_runner import OffPolicyRunner


def describe(name: str, runner: OffPolicyRunner, buffer: ReplayBuffer, generator: torch.Generator) -> None:
    data = buffer.data[: len(buffer)]
    algo = runner.algo
    with torch.no_grad():
        q = algo.critic(*algo.critic_inputs(data["obs"], data["action"]))  # [E, B]
        target = algo.critic_target(data, generator)
        action, _ = algo.sample_actions(data["obs"])
        q_policy = algo.critic(*algo.critic_inputs(data["obs"], action)).mean(0)
    reward, terminated = data["reward"], data["terminated"]
    print(
        f"{name}: {len(reward)} transitions, reward > 0 on {int((reward > 0).sum())}, terminated "
        f"{int(terminated.sum())}, rewarded without termination {int(((reward > 0) & ~terminated).sum())}"
    )
    for label, rows in (("success ends", (reward > 0) & terminated), ("the others", reward == 0)):
        if rows.any():
            mean_q = q.mean(0)[rows]
            print(
                f"  {label:12s} Q {mean_q.mean():.3f} (max {mean_q.max():.2f}), target "
                f"{target[rows].mean():.3f}, Q(s, pi) - Q(s, a) {(q_policy[rows] - mean_q).mean():+.3f}, "
                f"ensemble std {q.std(0)[rows].mean():.3f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="an off-policy run folder (config.yaml, checkpoints/last)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the target's critic subsets")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runner = OffPolicyRunner(compose(str(args.run / "config.yaml"), []), args.run, resume=True)
    print(f"iteration {runner.iteration}, {runner.env_steps} env steps")
    generator = torch.Generator().manual_seed(args.seed)
    describe("online", runner, runner.buffer, generator)
    if runner.demos is not None and len(runner.demos):
        describe("demos", runner, runner.demos, generator)
    runner.env.close()


if __name__ == "__main__":
    main()
