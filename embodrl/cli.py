"""The `embodrl` command: parses arguments, composes the config and hands over to the library."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator

from embodrl.errors import Terminated, UserError

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


def cmd_play(args: argparse.Namespace) -> None:
    from embodrl.config import compose
    from embodrl.train.play import play

    experiment, overrides = _experiment_and_overrides(args.config)
    cfg = compose(experiment, overrides)
    run_dir = play(cfg, args.policy, args.episodes, args.record, args.format)
    print(f"outputs: {run_dir}")
    print((run_dir / "summary.json").read_text())


def _run_config(args: argparse.Namespace, distributed: bool = False):
    """(config, run folder): a new run folder, or the one being resumed with its saved config.

    distributed: under torchrun (WORLD_SIZE > 1) join the process group first, so that rank 0 alone
    makes the run folder and every rank trains into it."""
    from pathlib import Path

    from embodrl.config import compose, make_run_dir
    from embodrl.parallel.distributed import from_main, init_from_env

    experiment, overrides = _experiment_and_overrides(args.config)
    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "config.yaml").is_file():
            raise UserError(f"--resume {run_dir}: not a run folder (config.yaml is missing)")
        if experiment is not None:
            raise UserError("--resume continues a run with its saved config; pass only key=value overrides")
        cfg = compose(str(run_dir / "config.yaml"), overrides)
    else:
        cfg = compose(experiment, overrides)
    if distributed:
        init_from_env(cfg.device)
    if args.resume:
        return cfg, run_dir
    return cfg, from_main(lambda: make_run_dir(cfg))


@contextlib.contextmanager
def _removed_if_unused(run_dir, fresh: bool):
    """A new run that fails before writing anything but its config (a bad task name, a missing dataset)
    takes its empty run folder with it; a resumed run's folder is never touched."""
    from embodrl.config import remove_unused_run_dir

    try:
        yield
    except BaseException:
        if fresh and remove_unused_run_dir(run_dir):
            print(f"run folder removed: the run wrote nothing but its config ({run_dir})", file=sys.stderr)
        raise


def cmd_train(args: argparse.Namespace) -> None:
    from embodrl.parallel import distributed
    from embodrl.train.sft_then_rl import train

    cfg, run_dir = _run_config(args, distributed=True)
    main = distributed.is_main()  # under torchrun only rank 0 reports
    if main:
        print(f"run folder: {run_dir}")
    try:
        with _removed_if_unused(run_dir, fresh=main and not args.resume):
            final = train(cfg, run_dir, resume=bool(args.resume))
    finally:
        distributed.close()
    if not main:
        return
    rl = f"{final['eval/success']:.1%}"
    start = f"SFT {final['sft/success']:.1%} -> RL " if "sft/success" in final else ""
    print(f"success: {start}{rl} (deterministic, {cfg.train.eval_episodes} fixed episodes)")
    print(f"checkpoint: {run_dir / 'checkpoints/last/policy'}")
    _print_best(final, "iteration", cfg.train.eval_episodes, run_dir)
    videos = f"; videos: {run_dir / 'videos'}" if cfg.train.videos else ""
    print(f"learning curve: {run_dir / 'learning_curve.png'}{videos}")


def cmd_pretrain(args: argparse.Namespace) -> None:
    if not args.resume:  # a resumed run keeps the source in its saved config
        args.config = [*args.config, "sft.source=expert"]
    cmd_sft(args)


def cmd_sft(args: argparse.Namespace) -> None:
    from embodrl.train.sft_runner import SFTRunner

    cfg, run_dir = _run_config(args)
    print(f"run folder: {run_dir}")
    with _removed_if_unused(run_dir, fresh=not args.resume):
        summary = SFTRunner(cfg, run_dir, resume=bool(args.resume)).learn()
    if "success_ci95" in summary:
        lo, hi = summary["success_ci95"]
        print(
            f"success after SFT: {summary['success_rate']:.1%} (95% CI {lo:.1%}-{hi:.1%}) "
            f"over {summary['episodes']} episodes"
        )
    elif "val/loss" in summary:  # env=none: held-out episodes of the dataset
        print(
            f"validation on held-out episodes: loss {summary['val/loss']:.4f}, "
            f"action error {summary['val/action_mae']:.4f} (mean |action - recorded|, dataset units)"
        )
    print(f"checkpoint: {run_dir / 'checkpoints/last/policy'} (use it with policy.init_from=...)")
    _print_best(summary, "step", cfg.sft.eval_episodes, run_dir)


def _print_best(final: dict, counted: str, episodes: int, run_dir) -> None:
    """The best checkpoint's line, when an earlier evaluation than the last one beat it."""
    if "best/held_out_success" in final:
        print(
            f"best: {counted} {int(final['best/iteration'])}, success {final['best/success']:.1%} on the "
            f"evaluation episodes; on {episodes} held-out ones: best {final['best/held_out_success']:.1%}, "
            f"last {final['best/last_held_out_success']:.1%}; "
            f"checkpoint: {run_dir / 'checkpoints/best/policy'}"
        )


def cmd_collect(args: argparse.Namespace) -> None:
    from embodrl.config import compose
    from embodrl.train.collect import CollectConfig, collect_demos

    experiment, overrides = _experiment_and_overrides(args.config)
    cfg = compose(experiment, overrides)
    first_state = {} if args.first_state is None else {"first_state_id": args.first_state}  # else its default
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip()) if args.tasks else ()
    collect_cfg = CollectConfig(
        episodes_per_task=args.episodes_per_task,
        noise_std=args.noise,
        seed=cfg.seed,
        tasks=tasks,
        post_success_steps=args.post_success_steps,
        keep_failures=args.keep_failures,
        policy=args.policy or "",
        device=cfg.device,
        **first_state,
    )
    if bool(args.out) == bool(args.resume):
        raise UserError("give --out DIR for a new dataset or --resume DIR to continue an interrupted one")
    stats = collect_demos(cfg.env, args.resume or args.out, collect_cfg, resume=bool(args.resume))
    print(stats.summary())


def cmd_reward_train(args: argparse.Namespace) -> None:
    import json

    from embodrl.rewards.config import RewardTrainConfig
    from embodrl.rewards.training import METRICS_FILE, train_reward_model
    from embodrl.structured import merge_to_object

    datasets = [a for a in args.inputs if "=" not in a]
    if not datasets:
        raise UserError("name at least one dataset folder before the key=value settings")
    cfg = merge_to_object(RewardTrainConfig, overrides=[a for a in args.inputs if "=" in a])
    out, metrics = train_reward_model(datasets, cfg)
    held, progress = metrics["held_out"], metrics["held_out_progress"]
    print(
        f"held-out episodes {metrics['episodes']['held_out']} ({held['frames']} frames, {held['positives']} "
        f"success): precision {held['precision']:.1%}, recall {held['recall']:.1%}, false-positive rate "
        f"{held['fpr']:.1%} at threshold {held['threshold']}; episodes with a false alarm "
        f"{held['episode_false_alarm']:.1%}"
    )
    print(json.dumps({k: held[k] for k in ("tp", "fp", "fn", "tn")}))
    for name, part in metrics.get("held_out_by_dataset", {}).items():
        print(f"  of them from {name}: {_classifier_scores(part)}")
    print(
        "as a dense reward: rank correlation with the frame index before the success "
        f"{progress['order']:.2f}; highest output {progress['peak_success']:.2f} in episodes with a success, "
        f"{progress['peak_failure']:.2f} in failures"
    )
    use = f" (use it with reward.model={out})" if cfg.model == "classifier" else ""
    print(f"{cfg.model} model: {out}{use}; metrics: {out / METRICS_FILE}")


def _classifier_scores(m: dict) -> str:
    """One line of a classifier's scores on a set of episodes (rewards.metrics.classification_metrics)."""
    return (
        f"{m['episodes']} episodes, {m['frames']} frames ({m['positives']} success): precision "
        f"{m['precision']:.1%}, recall {m['recall']:.1%}, false-positive rate {m['fpr']:.1%} at threshold "
        f"{m['threshold']}; episodes with a false alarm {m['episode_false_alarm']:.1%}"
    )


def cmd_reward_eval(args: argparse.Namespace) -> None:
    from embodrl.rewards.training import score_reward_model

    for name, m in score_reward_model(args.checkpoint, args.datasets).items():
        print(f"{name}: {_classifier_scores(m)}")


def cmd_check_dataset(args: argparse.Namespace) -> None:
    from embodrl.data.dataset_check import check_dataset

    report = check_dataset(args.dataset, repair=args.repair, quick=args.quick)
    print(report.summary())
    if not report.ok:
        raise SystemExit(1)


def cmd_eval(args: argparse.Namespace) -> None:
    import dataclasses
    import json
    from pathlib import Path

    from embodrl.config import compose, run_config_file
    from embodrl.policies.loading import load_policy
    from embodrl.sims.registry import make_env
    from embodrl.train.evaluation import evaluate_policy, summarize
    from embodrl.train.noise_action_env import env_for
    from embodrl.train.policy_setup import read_prompts_through

    checkpoint = Path(args.checkpoint)
    # A checkpoint inside a run folder (runs/x/t/checkpoints/last/policy) evaluates in that run's env.
    saved = run_config_file(checkpoint)
    cfg = compose(str(saved) if saved else None, args.overrides)
    policy = load_policy(checkpoint, device=cfg.device)
    # Never inside the checkpoint folder, which the next save of a resumed run replaces: beside the
    # run's checkpoints, or under run_root for a checkpoint from elsewhere; a new folder per call.
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else (saved.parent if saved else Path(cfg.run_root)) / "eval" / stamp
    if policy.cfg.steers and (args.demos or args.perturb):
        raise UserError(
            f"{checkpoint} picks the initial noise of {policy.cfg.steers}: evaluate it without --demos and "
            "--perturb"
        )
    if args.demos:
        _replay_demos(args, cfg, policy, out)
        return
    if args.perturb:
        _robustness(args, cfg, policy, out)
        return
    # the run's evaluation envs: with its seed, the same episodes get the same noise as in the run
    env_cfg = dataclasses.replace(cfg.env, num_envs=cfg.train.eval_envs or cfg.env.num_envs)
    # a noise-space actor's actions are decoded by the policy it steers (env_for wraps the env in it)
    with env_for(policy, make_env(env_cfg, device=cfg.device)) as env:
        read_prompts_through(policy, env.instruction_table)
        results = evaluate_policy(
            policy,
            env,
            args.episodes,
            args.record,
            out / "videos",
            deterministic=not args.stochastic,
            progress=True,
            seed=cfg.seed,  # the run's: the evaluation the run logged for these weights, repeated
            first_state_id=args.first_state,
        )
    summary = summarize(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    lo, hi = summary["success_ci95"]
    print(
        f"success: {summary['success_rate']:.1%} (95% CI {lo:.1%}-{hi:.1%}) over {summary['episodes']} "
        f"episodes; mean length {summary['mean_length']:.1f}"
    )
    flags = summary["flags"]  # the env's episode flags, e.g. tabletop-lang's wrong_object
    for name, flag in flags.items():
        print(f"{name}: {flag['rate']:.1%} of episodes")
    for grouping in ("per_task", "per_instruction"):
        for group, rate in summary[grouping].items():
            shares = "".join(f"  {name} {flag[grouping][group]:6.1%}" for name, flag in flags.items())
            print(f"  {rate:6.1%}{shares}  {group}")
    print(f"outputs: {out}")


def _robustness(args: argparse.Namespace, cfg, policy, out) -> None:
    import dataclasses

    from embodrl.train.robustness import parse_perturb, print_row, run_robustness, write_report

    levels = parse_perturb(args.perturb)
    # the run's evaluation envs and seeds, as a plain eval; the nominal rows leave a run's env.randomize off
    env_cfg = dataclasses.replace(cfg.env, num_envs=cfg.train.eval_envs or cfg.env.num_envs)
    seed = env_cfg.randomize.seed
    print(f"robustness over {args.episodes} paired episodes per level (perturbation seed {seed})")
    report = run_robustness(
        policy,
        env_cfg,
        levels,
        args.episodes,
        seed=cfg.seed,
        first_state_id=args.first_state,
        deterministic=not args.stochastic,
        explicit="all" not in [item.partition("=")[0] for item in args.perturb],
        device=cfg.device,
        on_row=print_row,
    )
    plot = write_report(report, out)
    print(
        f"outputs: {out / 'robustness.json'}, "
        + (str(plot) if plot else "no plot (matplotlib is not installed)")
    )


def _replay_demos(args: argparse.Namespace, cfg, policy, out) -> None:
    import dataclasses
    import json

    from embodrl.data.lerobot_dataset import LeRobotDataset
    from embodrl.sims.registry import make_env
    from embodrl.train.demo_replay import replay_demos, replayable_episodes
    from embodrl.train.policy_setup import read_prompts_through

    dataset = LeRobotDataset(args.demos)
    episodes = [e for e in replayable_episodes(dataset, cfg.env.task) if e >= args.first_demo][
        : args.episodes
    ]
    if not episodes:
        raise UserError(
            f"{args.demos} has no episode of env.task={cfg.env.task!r} from episode {args.first_demo} on"
        )
    env_cfg = dataclasses.replace(cfg.env, num_envs=min(len(episodes), cfg.env.num_envs))
    with make_env(env_cfg, device=cfg.device) as env:
        read_prompts_through(policy, env.instruction_table)
        report = replay_demos(policy, env, dataset, episodes, seed=cfg.seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo_replay.json").write_text(json.dumps(report.as_dict(), indent=2))
    print(
        f"replayed {report.episodes} demos (episodes {episodes[0]}-{episodes[-1]}, {report.steps} steps); "
        "mean |action - demo action|: "
        f"{report.error_on_env_obs:.4f} on the env's observations, {report.error_on_dataset_frames:.4f} on "
        f"the recorded frames (difference between the two actions {report.env_vs_dataset_action_gap:.4f})"
    )
    per_dimension = ", ".join(f"{name} {error:.4f}" for name, error in report.error_per_dimension.items())
    print(f"  per action dimension, on the env's observations: {per_dimension}")
    if report.camera_difference is not None:
        print(f"  renders vs recorded frames: {report.camera_difference:.2f}/255 mean absolute difference")
    if report.max_state_drift is not None:
        print(f"  largest state drift of the replays from the recorded states: {report.max_state_drift:.4g}")
    print(f"outputs: {out / 'demo_replay.json'}")


def cmd_serve(args: argparse.Namespace) -> None:
    import logging

    from embodrl.deploy.commands import serve
    from embodrl.deploy.config import ServerConfig, load_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = load_config(ServerConfig, args.config, args.overrides)
    print(
        f"serving {args.checkpoint} on ws://{cfg.host}:{cfg.port} (health: http://{cfg.host}:{cfg.port}/healthz)"
    )
    serve(args.checkpoint, cfg)


def cmd_deploy(args: argparse.Namespace) -> None:
    import json
    import logging

    from embodrl.deploy.commands import check_episodes, deploy
    from embodrl.deploy.config import DeployConfig, load_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    path, overrides = _experiment_and_overrides(args.config)
    cfg = load_config(DeployConfig, path, overrides)
    results = deploy(cfg)
    for stats in results:
        print(json.dumps(stats.as_dict()))
    check_episodes(results)


def cmd_learner(args: argparse.Namespace) -> None:
    import logging

    from embodrl.remote.config import LearnerServerConfig
    from embodrl.remote.learner import Learner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    server_cfg = LearnerServerConfig(host=args.host, port=args.port, max_pending_batches=args.max_pending)
    cfg, run_dir = _run_config(args)
    print(f"run folder: {run_dir}", flush=True)
    with _removed_if_unused(run_dir, fresh=not args.resume):
        final = Learner(cfg, run_dir, server_cfg, resume=bool(args.resume)).learn()
    print(f"success: {final['eval/success']:.1%} (deterministic, {cfg.train.eval_episodes} fixed episodes)")
    print(f"checkpoint: {run_dir / 'checkpoints/last/policy'}")


def cmd_actor(args: argparse.Namespace) -> None:
    import dataclasses
    import logging

    from embodrl.choices import check_positive
    from embodrl.config import compose
    from embodrl.remote.actor import run_actor
    from embodrl.remote.config import ActorConnectionConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    check_positive("--batch-steps", args.batch_steps)
    check_positive("--transitions", args.transitions, allow_zero=True)
    check_positive("--status-every", args.status_every)
    if args.robot:
        _robot_actor(args)
        return
    experiment, overrides = _experiment_and_overrides(args.config)
    cfg = compose(experiment, overrides)
    if cfg.train.torch_threads:
        import torch

        torch.set_num_threads(cfg.train.torch_threads)
    conn = ActorConnectionConfig(learner=args.learner, actor_id=args.id, wait_s=args.wait)
    # reward.model: the learner's classifier judges success, so the simulator's must not end episodes
    env = dataclasses.replace(cfg.env, terminate_on_success=False) if cfg.reward.model else cfg.env
    _, status = run_actor(
        env,
        conn,
        args.batch_steps,
        decisions=args.transitions,
        seed=cfg.seed,
        status_every_s=args.status_every,
        device=cfg.device,
        intervention=cfg.intervention if cfg.intervention.mode != "none" else None,
    )
    print(status)


def _robot_actor(args: argparse.Namespace) -> None:
    from embodrl.deploy.config import load_config
    from embodrl.remote.config import ActorConnectionConfig
    from embodrl.remote.robot_actor import run_robot_actor
    from embodrl.remote.robot_config import RobotActorConfig

    path, overrides = _experiment_and_overrides(args.config)
    cfg = load_config(RobotActorConfig, path, overrides)
    # a robot cannot pause: with the learner away, a full outbox drops its oldest batch
    conn = ActorConnectionConfig(
        learner=args.learner, actor_id=args.id, wait_s=args.wait, drop_when_full=True
    )
    _, status = run_robot_actor(cfg, conn, args.batch_steps, decisions=args.transitions)
    print(status)


def cmd_convert(args: argparse.Namespace) -> None:
    import yaml

    from embodrl.convert import convert

    options = {}
    for item in args.options:
        if "=" not in item:
            raise UserError(f"option {item!r} must look like key=value, e.g. decoding=oft")
        key, value = item.split("=", 1)
        options[key] = yaml.safe_load(value)  # 8 -> int, true -> bool, text stays text
    print(f"wrote {convert(args.kind, args.source, args.output, **options)}")


def _add_experiment_arguments(p: argparse.ArgumentParser, resume: bool = False) -> None:
    """The [EXPERIMENT] [OVERRIDES] list of a command that composes a config; with `resume`, --resume."""
    p.add_argument(
        "config", nargs="*", metavar="[EXPERIMENT] [OVERRIDES]", help="experiment and key=value overrides"
    )
    if resume:
        p.add_argument(
            "--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint"
        )


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
        "play",
        aliases=["rollout"],  # its former name: scripts that call it keep working
        help="play the scripted expert, a random policy or a checkpoint and write videos",
        description="Play episodes in an env from a fixed set of seeded initial states, print the success "
        "rate with a 95% confidence interval, and write videos and summary.json into runs/<name>/<time>/. "
        + OVERRIDES_HELP,
    )
    _add_experiment_arguments(p)
    p.add_argument(
        "--policy", default="expert", help="'expert' (scripted, default), 'random' or a checkpoint folder"
    )
    p.add_argument("--episodes", type=int, default=8, help="number of episodes (default 8)")
    p.add_argument("--record", type=int, default=2, help="number of episodes to record as videos (default 2)")
    p.add_argument("--format", choices=["mp4", "gif"], default="mp4", help="video format (default mp4)")
    p.set_defaults(func=cmd_play)

    p = sub.add_parser(
        "train",
        help="train a policy with PPO or GRPO in simulation, or off-policy with SAC (algo=sac)",
        description="On-policy RL: rollouts from seeded initial states, advantages (GAE or GRPO groups), "
        "clipped-PPO epochs; or off-policy (algo=sac: SAC with RLPD's recipe, a replay buffer saved with "
        "each checkpoint, demos from algo.demo_dataset). Both: periodic deterministic evaluation, "
        "checkpoints every train.save_every "
        "iterations (and on Ctrl-C, SIGTERM or a crash), TensorBoard logs, metrics.jsonl, a learning curve. "
        "Start from a checkpoint with policy.init_from=DIR (it keeps its own policy settings; the run warns "
        "about each one of the experiment it does not apply), or give sft.dataset=DIR to run behaviour "
        "cloning first (into RUN/sft/; every weight trains there, policy.lora applies to RL) and RL from its "
        "result. Data-parallel on K processes or GPUs: "
        "torchrun --nproc_per_node=K -m embodrl.cli train ... (each rank steps env.num_envs envs of its own; "
        "gradients averaged over ranks; rank 0 writes the run folder; engine.data_parallel=ddp replicates "
        "the weights, engine.data_parallel=fsdp shards them). " + OVERRIDES_HELP,
    )
    _add_experiment_arguments(p, resume=True)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "collect",
        help="record scripted-expert demonstrations as a LeRobotDataset v3",
        description="Run the suite's scripted experts and write successful episodes as a LeRobotDataset v3 "
        "folder (parquet + mp4 + meta/), readable by LeRobot/openpi tooling and by `embodrl sft`. With "
        "env.obs_mode=rgb the camera images are stored as videos. Failed expert episodes are dropped and "
        "counted. Every frame carries a success label (next.reward, next.done: LeRobot's HIL-SERL names). "
        + OVERRIDES_HELP,
    )
    _add_experiment_arguments(p)
    p.add_argument("--out", help="dataset folder to create")
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="continue a collection that was interrupted (kill, crash) in DIR, with the same experiment and "
        "settings: each task goes on from the initial state after its last kept episode",
    )
    p.add_argument(
        "--episodes-per-task", type=int, default=50, help="successful episodes per task (default 50)"
    )
    p.add_argument(
        "--noise",
        type=float,
        default=0.0,
        help="DART noise std: odd episodes execute noisy actions, labelled with the clean expert action",
    )
    p.add_argument(
        "--first-state",
        type=int,
        help="initial state id of the first attempt (default 50000, far from the states 0.. that evaluations "
        "play); another value gives demos disjoint from an earlier collection's, e.g. a held-out set",
    )
    p.add_argument(
        "--tasks",
        help="comma-separated subset of the suite's tasks to collect (with env.task=null), e.g. "
        "pretraining data without the target task: --tasks reach,push,place,stack,press",
    )
    p.add_argument(
        "--post-success-steps",
        type=int,
        default=0,
        metavar="K",
        help="record K more steps after the task succeeds (the expert holding; the simulator's success then "
        "does not end the episode): frames that show success, labelled next.reward=1, the positives of "
        "`embodrl reward train` (default 0)",
    )
    p.add_argument(
        "--keep-failures",
        action="store_true",
        help="keep failed attempts too (success=false in meta/episodes): negatives for `embodrl reward "
        "train`; --episodes-per-task still counts successes",
    )
    p.add_argument(
        "--policy",
        metavar="CHECKPOINT",
        help="record this checkpoint's episodes (its deterministic actions, every outcome kept and labelled "
        "by the simulator) instead of the scripted expert's: the states a trained policy reaches, for "
        "retraining a success classifier on its false alarms (`embodrl reward train DATASET MORE...`); "
        "--episodes-per-task then counts every episode",
    )
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser(
        "reward",
        help="learned rewards: `embodrl reward train DATASET` fits a success classifier",
        description="Learned rewards for RL without a simulator's success flag (HIL-SERL's reward "
        "classifier). See docs/rewards.md.",
    )
    reward = p.add_subparsers(dest="reward_command", metavar="SUBCOMMAND", required=True)
    p = reward.add_parser(
        "train",
        help="fit a success classifier on a labelled LeRobot dataset",
        description="Fit a success classifier: the frozen ImageNet-pretrained EfficientNet-Lite0 tower's "
        "features of the camera images (computed once per frame) and the state -> P(task done), trained on "
        "the per-frame labels next.reward (embodrl collect --post-success-steps K --keep-failures, or the "
        "deploy recorder's success key). Episodes are split into train and held-out (held_out=0.25); "
        "prints precision, recall and false-positive rate on the held-out episodes at the threshold, and "
        "writes the checkpoint folder (config.json + model.safetensors) and metrics.json. Use the result "
        "with `embodrl train ... reward.model=DIR`. Settings as key=value: out, obs_keys, key_map, blocks, "
        "channels, hidden, held_out, epochs, batch_size, lr, weight_decay, balance, threshold, seed, device; "
        "model=progress fits a progress model instead (VLAC-style dense reward: each frame's progress "
        "t / t_success on episodes with a success), scored on the same held-out episodes.",
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="DATASET [DATASET ...] [key=value ...]",
        help="LeRobot dataset folders (or repo ids in LeRobot's local cache): trained on together, e.g. "
        "demos and a policy's own episodes (`embodrl collect --policy`), whose false alarms the first "
        "classifier missed; then settings as key=value, e.g. out=runs/reward/pick",
    )
    p.set_defaults(func=cmd_reward_train)
    p = reward.add_parser(
        "eval",
        help="score a trained success classifier on labelled datasets",
        description="Score a classifier of `embodrl reward train` on every frame of labelled LeRobot "
        "datasets (per dataset: precision, recall, false-positive rate at its threshold, and the share of "
        "episodes with a false alarm), e.g. on a policy's own episodes recorded with `embodrl collect "
        "--policy`: the false alarms that policy could exploit, before they join the training set.",
    )
    p.add_argument("checkpoint", help="a folder written by `embodrl reward train`")
    p.add_argument("datasets", nargs="+", metavar="DATASET", help="labelled LeRobot dataset folders")
    p.set_defaults(func=cmd_reward_eval)

    p = sub.add_parser(
        "sft",
        help="behaviour cloning of any policy family from a dataset",
        description="Supervised fine-tuning (behaviour cloning) from a LeRobotDataset v3 folder: AdamW "
        "with warm-up + cosine, grad clipping, fp32 or bf16, progress with loss and samples/s, TensorBoard, "
        "periodic evaluation in the env, checkpoints, --resume. Set sft.dataset=DIR; "
        "sft.max_episodes=k for few-shot. " + OVERRIDES_HELP,
    )
    _add_experiment_arguments(p, resume=True)
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser(
        "pretrain",
        help="SFT on the scripted expert played live over endless new scenes: a base for few-shot SFT",
        description="Pretraining on simulated data: `embodrl sft` whose samples come from the env's scripted "
        "expert playing initial states no evaluation or collected demo uses (sft.stream_first_state_id on), "
        "instead of a dataset. Successful episodes become action-chunk samples in a pool of the latest "
        "sft.stream_pool; each is drawn sft.stream_reuse times on average, so the policy sees many more "
        "scenes than a collected dataset holds. With policy.sft_aux_keys=[privileged] it also regresses what "
        "the simulator knows (the named object's pose, the goal, their offsets from the hand). The result is "
        "a checkpoint for policy.init_from. " + OVERRIDES_HELP,
    )
    _add_experiment_arguments(p, resume=True)
    p.set_defaults(func=cmd_pretrain)

    p = sub.add_parser(
        "eval",
        help="success rate of a checkpoint with 95%% confidence intervals and videos",
        description="Evaluate a policy checkpoint on a fixed seeded set of episodes: success rate per "
        "instruction with a 95% Wilson interval, mean episode length, videos and summary.json. A checkpoint "
        "inside a run folder is evaluated in that run's env unless overridden (key=value).",
    )
    p.add_argument("checkpoint", help="policy folder (config.json + model.safetensors)")
    p.add_argument(
        "overrides", nargs="*", metavar="OVERRIDES", help="key=value overrides, e.g. env.num_envs=16"
    )
    p.add_argument("--episodes", type=int, default=100, help="number of episodes (default 100)")
    p.add_argument("--record", type=int, default=4, help="episodes recorded as mp4 (default 4)")
    p.add_argument(
        "--first-state",
        type=int,
        default=0,
        help="initial state id of the first episode (default 0, the states a run evaluates on; a run's "
        "held-out evaluation of its best checkpoint starts at train.eval_episodes)",
    )
    p.add_argument(
        "--stochastic", action="store_true", help="sample actions instead of the deterministic mode"
    )
    p.add_argument(
        "--demos",
        metavar="DATASET",
        help="instead of playing episodes, replay the demos of DATASET (a folder from `embodrl collect`) "
        "from their recorded initial states and report the policy's action error against theirs, on the "
        "env's observations and on the recorded frames: equal errors rule out a sim/data mismatch, so a "
        "policy that fits its demos but fails in closed loop drifts off them (--episodes caps the demos)",
    )
    p.add_argument(
        "--first-demo",
        type=int,
        default=0,
        metavar="K",
        help="with --demos, replay the dataset's episodes from index K on (default 0). A policy trained with "
        "sft.max_episodes=K never saw them: its error there against its error on demos 0.. measures how "
        "well it generalizes off its training demos",
    )
    p.add_argument(
        "--perturb",
        nargs="+",
        action="extend",
        metavar="AXIS[=LEVELS]",
        help="robustness evaluation: the same --episodes nominal and under each perturbation level, paired "
        "by initial state; prints success with a 95%% interval and the drop against nominal per axis and "
        "level, writes robustness.json and robustness.png. AXIS: all, camera, lighting, color, size, "
        "distractors, spawn, instruction, conflict, proprio_noise, object_noise, action_noise, latency, "
        "mass, friction, gains (docs/configuration.md); LEVELS: 1,2,3 (default: all). Draws follow "
        "env.randomize.seed. Give key=value overrides before it",
    )
    p.add_argument(
        "--out",
        help="output folder (default: RUN/eval/TIMESTAMP for a checkpoint inside run folder RUN, else "
        "run_root/eval/TIMESTAMP; never inside the checkpoint, which a resumed run replaces)",
    )
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "check-dataset",
        help="validate a LeRobotDataset v3 folder and say what is wrong (--repair fixes what it can)",
        description="Check that a LeRobotDataset v3 folder reads and that info.json, the episodes table "
        "and the data agree (counts, frame ranges, episode and frame indices, task ids, stats), and that "
        "every episode's video decodes (skip with --quick). --repair finishes an interrupted "
        "consolidation, removes unfinished *.tmp files and the files of an episode a kill left unlisted. "
        "Exits 1 while problems remain.",
    )
    p.add_argument("dataset", help="dataset folder (e.g. written by `embodrl collect` or LeRobot)")
    p.add_argument("--repair", action="store_true", help="fix what can be fixed")
    p.add_argument("--quick", action="store_true", help="do not decode the videos")
    p.set_defaults(func=cmd_check_dataset)

    p = sub.add_parser(
        "serve",
        help="serve a checkpoint over openpi's websocket policy protocol",
        description="Serve a policy checkpoint to robots: openpi's websocket + msgpack-numpy protocol "
        "(existing openpi clients work unchanged), /healthz, optional API key (Authorization: Api-Key ...), "
        "bounded message size, per-request timeout, batching of concurrent clients. Settings: host, port, "
        "api_key, "
        "device, keys.* (request key mapping), ... as key=value or a YAML file (--config).",
    )
    p.add_argument("checkpoint", help="policy folder (config.json + model.safetensors)")
    p.add_argument("overrides", nargs="*", metavar="OVERRIDES", help="key=value, e.g. port=8000 host=0.0.0.0")
    p.add_argument("--config", help="YAML file with ServerConfig fields")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "deploy",
        help="run a policy on a robot: control loop, chunk execution, safety, recording",
        description="The robot-side loop at a fixed rate: robot adapter (sim, LeRobot robot, Franka) "
        "-> observation -> policy (a local checkpoint, or ws://host:port for `embodrl serve`) -> chunk "
        "execution (open_loop, blend, rtc) -> safety layer (bounds, workspace, delta/velocity limits, "
        "watchdog) -> robot. Every episode is recorded as a LeRobotDataset v3 when record_dir is set.",
    )
    p.add_argument(
        "config",
        nargs="*",
        metavar="[CONFIG.yaml] [OVERRIDES]",
        help="YAML file with DeployConfig fields, then key=value, e.g. policy=ws://127.0.0.1:8000",
    )
    p.set_defaults(func=cmd_deploy)

    p = sub.add_parser(
        "learner",
        help="off-policy training (algo=sac) from remote actors' transitions, serving them its weights",
        description="The learner of an actor/learner split (SERL-style): trains the experiment's off-policy "
        "algorithm on the transitions that `embodrl actor` processes stream to it over websockets "
        "(msgpack, API key from EMBODRL_API_KEY), and serves them versioned weights. Each batch is stored "
        "in the run's transition log before it is acknowledged; --resume replays what the last checkpoint "
        "does not hold, so a killed learner loses no acknowledged transition. An iteration is as many "
        "updates as the local runner's; updates wait for data (one per transition beyond "
        "algo.learning_starts). Steps actors flag as interventions join the demo buffer; cameras arrive "
        "raw and are stored as the policy's frozen features; with reward.model the classifier labels "
        "every transition's reward, never the actor. " + OVERRIDES_HELP,
    )
    _add_experiment_arguments(p, resume=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all; default local)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument(
        "--max-pending",
        type=int,
        default=64,
        help="stored batches waiting for the trainer before acknowledgements wait (default 64)",
    )
    p.set_defaults(func=cmd_learner)

    p = sub.add_parser(
        "actor",
        help="play a simulator or a robot with a remote learner's weights and stream its transitions to it",
        description="An actor of `embodrl learner`: builds the learner's policy from the spec it sends, acts "
        "at random until the learner publishes weights, and sends transitions in batches. Acting never "
        "waits on the network: unacknowledged batches stay in a bounded outbox and are resent after a "
        "reconnect (with backoff); the learner drops duplicates by (actor id, batch number). The API key "
        "comes from EMBODRL_API_KEY. Simulated (default): give the learner's experiment (its env; with "
        "intervention.mode=expert the env's scripted expert takes over where the policy strays). "
        + OVERRIDES_HELP
        + " Robot (--robot): give `embodrl deploy`'s robot settings instead (a YAML of them, then "
        "key=value: robot.kind=sim, safety.*, teleop.keyboard=true, fps, max_steps, record_dir), plus "
        "episodes (0: until the learner finishes), workspace_box and reset.mode (auto|robot|home|"
        "operator, reset.home). Every action, the policy's or that of a human who took over with teleop, "
        "goes through the safety layer, with the end-effector box safety.workspace_low/high on by default "
        "(the sim has one; other robots must set it, or workspace_box=false); steps a human drove are "
        "flagged and join the learner's demos; the intervention rate and safety clamps are printed per "
        "episode.",
    )
    p.add_argument(
        "config",
        nargs="*",
        metavar="[EXPERIMENT|ROBOT.yaml] [OVERRIDES]",
        help="the learner's experiment and overrides; with --robot, robot settings and key=value",
    )
    p.add_argument(
        "--robot",
        action="store_true",
        help="act on a robot (robot.kind=sim: the MuJoCo stand-in) through the deploy loop and safety layer",
    )
    p.add_argument("--learner", default="ws://127.0.0.1:8765", help="the learner's ws://host:port")
    p.add_argument("--id", default="actor-0", help="this actor's id, unique per learner (default actor-0)")
    p.add_argument(
        "--batch-steps",
        type=int,
        default=8,
        help="decisions per batch, each env.num_envs transitions (default 8)",
    )
    p.add_argument(
        "--transitions",
        type=int,
        default=0,
        help="stop after this many (--robot: at the end of that episode; default 0: run on)",
    )
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the learner to start")
    p.add_argument("--status-every", type=float, default=10.0, help="seconds between status lines")
    p.set_defaults(func=cmd_actor)

    from embodrl.convert import CONVERSIONS  # torch-free: lists the kinds for --help

    p = sub.add_parser(
        "convert",
        help="import/export OpenVLA(-OFT) and pi0/pi0.5 checkpoints; merge LoRA adapters",
        description="Convert between public checkpoint layouts and embodrl policy checkpoints: "
        "openvla-import (HF OpenVLA / OpenVLA-OFT folder), openvla-export, pi0-import (openpi PyTorch "
        "or LeRobot pi0/pi0.5 folder; fmt=openpi|lerobot), pi0-export, merge-lora, and "
        "export-torchscript / export-onnx (the deterministic action program of a gaussian or MLP-flow "
        "policy, normalization included). Options are key=value, e.g. decoding=oft chunk_size=8 for "
        "OpenVLA-OFT or fmt=lerobot for a LeRobot pi0. Nothing is downloaded.",
    )
    p.add_argument("kind", choices=list(CONVERSIONS), help="the conversion")
    p.add_argument("source", help="folder to read")
    p.add_argument("output", help="new folder to write")
    p.add_argument("options", nargs="*", metavar="OPTIONS", help="key=value options for the conversion")
    p.set_defaults(func=cmd_convert)
    return parser


POSITIONAL_LISTS = ("config", "overrides", "options")  # each command's trailing key=value list


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C while a command runs: `kill`, SLURM preemption or `docker stop` then
    save the run's checkpoint instead of losing the work since the last one."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live on the main thread
        yield
        return

    def raise_terminated(signum, frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Overrides may follow options (`collect X --out d env.num_envs=8`): argparse leaves such trailing
    # positionals unparsed, so they join the command's positional list; unknown flags stay errors.
    rest = next((name for name in POSITIONAL_LISTS if isinstance(getattr(args, name, None), list)), None)
    flags = [a for a in extra if a.startswith("-")]
    if flags or (extra and rest is None):
        parser.error(f"unrecognized arguments: {' '.join(flags or extra)}")
    if extra:
        getattr(args, rest).extend(extra)
    try:
        with sigterm_interrupts():
            args.func(args)
    except UserError as e:
        print(f"embodrl {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"embodrl {args.command}: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print(f"embodrl {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
