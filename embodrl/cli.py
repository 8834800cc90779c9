"""The `embodrl` command: parses arguments, composes the config and hands over to the library."""

from __future__ import annotations

import argparse
import sys

from embodrl.errors import UserError

OVERRIDES_HELP = (
    "EXPERIMENT is a preset name from configs/experiment/ or a .yaml path (optional). "
    "Overrides are key=value (env.num_envs=16) or group=preset (env=tabletop_lang)."
)


def _experiment_and_overrides(items: list[str]) -> tuple[str | None, list[str]]:
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


def cmd_envs(args: argparse.Namespace) -> None:
    from embodrl.sims.registry import describe_suites

    suites = describe_suites()
    if args.suite and args.suite not in suites:
        raise UserError(f"unknown suite {args.suite!r}; valid suites: {', '.join(suites)}")
    for suite, tasks in suites.items():
        if args.suite and suite != args.suite:
            continue
        print(suite)
        for task, instructions in tasks.items():
            print(f"  {task}")
            for text in instructions[: None if args.all else 3]:
                print(f"    - {text}")


def cmd_rollout(args: argparse.Namespace) -> None:
    from embodrl.config import compose
    from embodrl.train.rollout import rollout

    experiment, overrides = _experiment_and_overrides(args.config)
    cfg = compose(experiment, overrides)
    run_dir = rollout(cfg, args.policy, args.episodes, args.record, args.format)
    print(f"outputs: {run_dir}")
    print((run_dir / "summary.json").read_text())


def cmd_train(args: argparse.Namespace) -> None:
    from pathlib import Path

    from embodrl.config import compose, make_run_dir
    from embodrl.train.rl_runner import OnPolicyRunner

    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "config.yaml").is_file():
            raise UserError(f"--resume {run_dir}: not a run folder (config.yaml is missing)")
        _, overrides = _experiment_and_overrides(args.config)
        cfg = compose(str(run_dir / "config.yaml"), overrides)
    else:
        experiment, overrides = _experiment_and_overrides(args.config)
        cfg = compose(experiment, overrides)
        run_dir = make_run_dir(cfg)
    print(f"run folder: {run_dir}")
    final = OnPolicyRunner(cfg, run_dir, resume=bool(args.resume)).learn()
    print(f"final eval success: {final['eval/success']:.1%} over {cfg.train.eval_episodes} episodes")
    print(f"checkpoint: {run_dir / 'checkpoints/last/policy'}")
    print(f"learning curve: {run_dir / 'learning_curve.png'}; videos: {run_dir / 'videos'}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embodrl",
        description="Fine-tune robot VLA policies with RL in simulation, then deploy them.",
        epilog="Run `embodrl COMMAND --help` for each command's options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "envs",
        help="list simulator suites, their tasks and example instructions",
        description="List the simulator suites, the tasks of each and example instructions.",
    )
    p.add_argument("--suite", help="show only this suite")
    p.add_argument("--all", action="store_true", help="show every instruction, not just three per task")
    p.set_defaults(func=cmd_envs)

    p = sub.add_parser(
        "rollout",
        help="play the scripted expert, a random policy or a checkpoint and write videos",
        description="Play episodes in an env from a fixed set of seeded initial states, print the success "
        "rate with a 95%% confidence interval, and write videos and summary.json into runs/<name>/<time>/. "
        + OVERRIDES_HELP,
    )
    p.add_argument(
        "config", nargs="*", metavar="[EXPERIMENT] [OVERRIDES]", help="experiment and key=value overrides"
    )
    p.add_argument("--policy", default="expert", help="'expert' (scripted, default) or 'random'")
    p.add_argument("--episodes", type=int, default=8, help="number of episodes (default 8)")
    p.add_argument("--record", type=int, default=2, help="number of episodes to record as videos (default 2)")
    p.add_argument("--format", choices=["mp4", "gif"], default="mp4", help="video format (default mp4)")
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser(
        "train",
        help="train a policy with PPO or GRPO in simulation",
        description="On-policy RL: rollouts from seeded initial states, advantages (GAE or GRPO groups), "
        "clipped-PPO epochs, periodic deterministic evaluation, checkpoints every train.save_every "
        "iterations (and on Ctrl-C or a crash), TensorBoard logs, metrics.jsonl and a learning curve. "
        "Start from a checkpoint with policy.init_from=DIR. " + OVERRIDES_HELP,
    )
    p.add_argument(
        "config", nargs="*", metavar="[EXPERIMENT] [OVERRIDES]", help="experiment and key=value overrides"
    )
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.set_defaults(func=cmd_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except UserError as e:
        print(f"embodrl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"embodrl {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
