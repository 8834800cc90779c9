"""`embodrl collect`: scripted-expert demonstrations written as a LeRobotDataset v3.0 folder.

Every frame carries a success label under LeRobot's HIL-SERL names: `next.reward` is 1.0 where the frame's
observation shows the task done (as in LeRobot's HIL-SERL recordings, whose reward classifier learns
`next.reward` from the same frame's images) and `next.done` marks an episode's last frame; meta/episodes
holds each episode's outcome (`success`). `post_success_steps` records frames past the success (the expert
holding) and `keep_failures` keeps failed attempts: the positives and negatives of a success classifier.
With `policy` (a checkpoint folder) the checkpoint acts instead of the expert and every episode is kept, each
labelled by the simulator: the states a trained policy reaches, where a classifier trained on demos alone
errs (HIL-SERL has a person label them; here the simulator does).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict
from tqdm import tqdm

from embodrl.choices import check_positive
from embodrl.data.lerobot_dataset import locate_dataset
from embodrl.data.lerobot_format import ACTION_KEY, DONE_KEY, LEROBOT_KEYS, REWARD_KEY
from embodrl.data.lerobot_writer import LeRobotDatasetWriter, is_consolidated, read_episode_rows
from embodrl.data.video import VideoConfig
from embodrl.errors import UserError
from embodrl.sims.base import VecEnv
from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env, suite_tasks
from embodrl.train.episodes import ActFn, run_episodes
from embodrl.train.evaluation import seeded_torch_rng
from embodrl.train.hold_after_success import HoldAfterSuccess
from embodrl.train.play import action_source


@dataclass
class CollectConfig:
    """How many demonstrations, and how they are perturbed (DART) and stored."""

    episodes_per_task: int = 50  # successful episodes kept per task
    # DART (Laskey et al. 2017): odd-numbered attempts execute expert + N(0, noise_std^2) but are
    # labelled with the clean expert action, so the data shows how to recover from small errors.
    noise_std: float = 0.0
    seed: int = 0  # seeds the DART noise
    fps: int = 20  # the env's control rate (the tabletop suite steps at 0.05 s)
    # Demos start from initial state ids here, so they never share a start with evaluation (ids from 0).
    first_state_id: int = 50_000
    max_attempts_per_episode: float = 3.0  # give up on a task after this many attempts per wanted episode
    # A subset of the suite's named tasks (env.task unset), e.g. pretraining data that leaves the target
    # task out; empty: every task.
    tasks: tuple[str, ...] = ()
    # Steps recorded past the first success (the expert holding, labelled by the simulator's success): the
    # positive frames of a success classifier. 0: the episode ends at the success, which no frame shows.
    post_success_steps: int = 0
    keep_failures: bool = False  # keep failed attempts too (negatives for a classifier; success=False)
    # A checkpoint folder whose deterministic actions are recorded instead of the expert's; every episode
    # is kept and counts toward episodes_per_task. "": the scripted expert.
    policy: str = ""
    device: str = "cpu"  # where the policy runs
    video: VideoConfig = field(default_factory=VideoConfig)

    def __post_init__(self) -> None:
        check_positive("collect.episodes_per_task", self.episodes_per_task)
        check_positive("collect.noise_std", self.noise_std, allow_zero=True)
        check_positive("collect.fps", self.fps)
        check_positive("collect.first_state_id", self.first_state_id, allow_zero=True)
        check_positive("collect.max_attempts_per_episode", self.max_attempts_per_episode)
        check_positive("collect.post_success_steps", self.post_success_steps, allow_zero=True)
        if self.policy and self.noise_std > 0:
            raise UserError("--noise perturbs the scripted expert's actions; drop it with --policy")
        if self.policy and not Path(self.policy).is_dir():
            raise UserError(f"--policy {self.policy}: no such checkpoint folder")


@dataclass
class CollectStats:
    """What a collect run produced: kept episodes and expert failures (dropped unless kept), per task."""

    root: Path
    episodes: int = 0
    frames: int = 0
    failures: int = 0
    failures_kept: bool = False
    per_task: dict[str, tuple[int, int]] = field(default_factory=dict)  # task -> (successes, failures)
    seconds: float = 0.0
    policy: str = ""  # the checkpoint that acted; "": the scripted expert

    def summary(self) -> str:
        if self.policy:
            tasks = ", ".join(f"{t}: {k}/{k + f} succeeded" for t, (k, f) in self.per_task.items())
            return (
                f"{self.episodes + self.failures} episodes of {self.policy} ({self.frames} frames) written "
                f"to {self.root} in {self.seconds:.1f}s; {self.episodes} successes [{tasks}]"
            )
        tasks = ", ".join(f"{t}: {k} kept / {f} failed" for t, (k, f) in self.per_task.items())
        return (
            f"{self.episodes} episodes ({self.frames} frames) written to {self.root} in {self.seconds:.1f}s; "
            f"{self.failures} expert failures {'kept' if self.failures_kept else 'dropped'} [{tasks}]"
        )


def dataset_features(env: VecEnv) -> dict[str, dict]:
    """LeRobot features for an env's observations (cameras as video), actions and success labels."""
    features = {}
    for key, name in LEROBOT_KEYS.items():
        spec = env.observation_spec.get(key)
        if spec is None:
            continue
        if spec.dtype == torch.uint8:
            features[name] = {
                "dtype": "video",
                "shape": list(spec.shape),
                "names": ["height", "width", "channels"],
            }
        else:
            features[name] = {"dtype": "float32", "shape": list(spec.shape), "names": None}
    action = env.action_spec
    features[ACTION_KEY] = {"dtype": "float32", "shape": [action.dim], "names": list(action.names) or None}
    features[REWARD_KEY] = {"dtype": "float32", "shape": [1], "names": None}
    features[DONE_KEY] = {"dtype": "bool", "shape": [1], "names": None}
    return features


def collect_episodes(
    env: VecEnv,
    writer: LeRobotDatasetWriter,
    num_episodes: int,
    cfg: CollectConfig,
    bar: tqdm | None = None,
    env_task: str = "",
    max_steps: int | None = None,
) -> tuple[int, int]:
    """Run the env's scripted expert (`env.expert_actions()` [N, A]) until `num_episodes` succeed, or
    `cfg.policy` for `num_episodes` episodes whatever their outcome.

    Attempt k starts from initial state `cfg.first_state_id + k`; failed episodes are dropped (kept with
    `cfg.keep_failures`). An episode goes on `cfg.post_success_steps` past its first success, which needs
    an env whose success does not end episodes, and ends unsuccessful after `max_steps` (default: the
    env's own limit alone). Returns (successes kept, failures). Each kept episode records its initial
    state id, `env_task` (the task the env was built for, which the ids index) and its outcome (`success`)
    in meta/episodes, so `embodrl eval --demos` can replay it. Each env
    holds at most one attempt; no attempt starts once the ones in flight could complete the quota, so
    the kept set does not depend on how many envs run in parallel.
    """
    if not cfg.policy and not hasattr(env, "expert_actions"):
        raise UserError(f"{type(env).__name__} has no scripted expert (expert_actions); collect needs one")
    env = HoldAfterSuccess(env, cfg.post_success_steps, max_steps)
    n = env.num_envs
    max_attempts = num_episodes if cfg.policy else math.ceil(num_episodes * cfg.max_attempts_per_episode)
    if cfg.first_state_id + max_attempts > env.num_init_states:
        raise UserError(
            f"collect would use initial states up to {cfg.first_state_id + max_attempts}, but the env has "
            f"{env.num_init_states}; lower collect.first_state_id or collect.episodes_per_task"
        )
    keys = {k: v for k, v in LEROBOT_KEYS.items() if k in env.observation_spec}
    spec = env.action_spec
    attempt = np.full(n, -1)  # attempt number running in each env; -1: idle
    buffers: list[dict[str, list[np.ndarray]]] = [{} for _ in range(n)]
    tasks = [""] * n
    noise: list[np.random.Generator | None] = [None] * n  # seeded per attempt: results ignore env count
    counts = {"succeeded": 0, "failed": 0, "started": 0}
    policy_step = PolicySteps(action_source(cfg.policy, env, cfg.seed, cfg.device), n) if cfg.policy else None

    def next_attempt(i: int) -> int:
        # Attempts just reported to end_attempt count as in flight until their own env is asked here
        # (conservative: it can only delay a start, never change which attempts run).
        attempt[i] = -1
        in_flight = int((attempt >= 0).sum())
        kept = counts["succeeded"] + (counts["failed"] if cfg.policy else 0)  # toward the quota
        if kept + in_flight < num_episodes and counts["started"] < max_attempts:
            attempt[i] = counts["started"]
            noise[i] = np.random.default_rng((cfg.seed, attempt[i]))
            counts["started"] += 1
            buffers[i] = {name: [] for name in (*keys.values(), ACTION_KEY, REWARD_KEY)}
        return int(attempt[i])

    def act(obs: TensorDict) -> torch.Tensor:
        active = np.flatnonzero(attempt >= 0)
        fresh = [int(i) for i in active if not buffers[i][ACTION_KEY]]  # first step: the reset observation
        if policy_step is not None:
            expert = executed = np.clip(policy_step(obs, fresh), spec.low, spec.high)  # its own label
        else:
            expert = env.expert_actions().cpu().numpy().astype(np.float32)  # [N, A]
            executed = expert.copy()
            if cfg.noise_std > 0:
                for i in np.flatnonzero((attempt >= 0) & (attempt % 2 == 1)):
                    executed[i] += cfg.noise_std * noise[i].standard_normal(expert.shape[1], dtype=np.float32)
            executed = np.clip(executed, spec.low, spec.high)
        if fresh:
            texts = (
                env.instructions(obs["task_id"][fresh]) if "task_id" in obs.keys() else ["demo"] * len(fresh)
            )
            for i, text in zip(fresh, texts, strict=True):
                tasks[i] = text
        values = {name: obs[key].cpu().numpy() for key, name in keys.items()}
        values[REWARD_KEY] = env.success_now.numpy().astype(np.float32)  # the label of the state shown
        for i in active:
            for name, v in values.items():
                buffers[i][name].append(v[i])
            buffers[i][ACTION_KEY].append(expert[i])  # the clean label, whatever was executed
        return torch.from_numpy(executed)[:, None]  # chunk of one: [N, 1, A]

    def end_attempt(i: int, episode: int, success: bool) -> None:
        if success or cfg.keep_failures or cfg.policy:
            data = {k: np.stack(v) for k, v in buffers[i].items()}
            data[DONE_KEY] = np.arange(len(data[ACTION_KEY])) == len(data[ACTION_KEY]) - 1
            info = {"init_state_id": cfg.first_state_id + episode, "env_task": env_task, "success": success}
            writer.add_episode(data, tasks[i], info)
        counts["succeeded" if success else "failed"] += 1
        if bar is not None:
            if success or cfg.policy:
                bar.update(1)
            if not success:
                bar.set_postfix(failed=counts["failed"])
        buffers[i] = {}

    with seeded_torch_rng(cfg.seed, torch.device(cfg.device)):  # a policy's noise draws repeat
        run_episodes(
            env,
            act,
            max_attempts,
            first_state_id=cfg.first_state_id,
            next_episode=next_attempt,
            on_episode_end=end_attempt,
        )
    return counts["succeeded"], counts["failed"]


class PolicySteps:
    """A checkpoint's action chunks [N, C, A] played one step at a time: each env executes its chunk in
    order, and a new one is asked for (for every env at once) when an env has run out or starts an
    episode, so the frames between the chunk's steps are recorded too."""

    def __init__(self, act: ActFn, num_envs: int) -> None:
        self.act = act
        self.queue: list[list[np.ndarray]] = [[] for _ in range(num_envs)]

    def __call__(self, obs: TensorDict, fresh: list[int]) -> np.ndarray:
        stale = set(fresh) | {i for i, q in enumerate(self.queue) if not q}
        if stale:
            chunks = self.act(obs).cpu().numpy().astype(np.float32)  # [N, C, A]
            for i in stale:
                self.queue[i] = list(chunks[i])
        return np.stack([q.pop(0) for q in self.queue])


def tasks_to_collect(env_cfg: EnvConfig, only: tuple[str, ...] = ()) -> tuple[str | None, ...]:
    """The tasks to collect separately: the configured one, `only` (a subset of the suite's named tasks),
    the suite's named tasks, or the env as is."""
    tasks = suite_tasks(env_cfg.suite)
    if only:
        if env_cfg.task is not None:
            raise UserError(f"--tasks picks tasks of the suite; drop env.task={env_cfg.task} to use it")
        unknown = [t for t in only if tasks is None or t not in tasks]
        if unknown:
            valid = ", ".join(tasks) if tasks else "none (this suite has no named tasks)"
            raise UserError(f"unknown task(s) {', '.join(unknown)} for suite {env_cfg.suite}; valid: {valid}")
        return only
    if env_cfg.task is not None:
        return (env_cfg.task,)
    return (None,) if tasks is None else tasks


def collect_demos(
    env_cfg: EnvConfig,
    out_dir: str | Path,
    cfg: CollectConfig,
    progress: bool = True,
    resume: bool = False,
) -> CollectStats:
    """Collect `cfg.episodes_per_task` expert demos for every task of `env_cfg` into one dataset.

    Episodes are saved as they finish: an interrupted run leaves every saved episode readable, and
    `resume` continues it (each task from the initial state after its last kept one); a finished run
    concatenates them into LeRobot's usual files.
    """
    tasks = tasks_to_collect(env_cfg, cfg.tasks)
    stats = CollectStats(root=Path(out_dir), failures_kept=cfg.keep_failures, policy=cfg.policy)
    begin = time.perf_counter()
    writer: LeRobotDatasetWriter | None = None
    done: Counter[str] = Counter()  # env_task -> episodes kept before this run (resume)
    next_state: dict[str, int] = {}  # env_task -> the initial state to go on from
    if resume:
        out_dir = locate_dataset(out_dir)
        rows = read_episode_rows(out_dir)
        done.update(row.get("env_task", "") for row in rows if cfg.policy or row.get("success", True))
        if rows and is_consolidated(rows):  # killed after it was finalized: done if it holds what was asked
            short = {
                t or env_cfg.suite: done[t or ""] for t in tasks if done[t or ""] < cfg.episodes_per_task
            }
            if short:
                raise UserError(
                    f"{out_dir} is a finished dataset with fewer episodes than asked ({short}); collect the "
                    "rest into a new folder"
                )
            stats.frames = sum(row["length"] for row in rows)
            return stats
        writer = LeRobotDatasetWriter.reopen(out_dir, cfg.video)
        for row in rows:
            task = row.get("env_task", "")
            next_state[task] = max(next_state.get(task, 0), int(row["init_state_id"]) + 1)
    bar = None  # opened once the first env and the dataset folder are made: an error there prints alone
    for task in tasks:
        wanted = cfg.episodes_per_task - done[task or ""]
        if wanted <= 0:
            stats.per_task[task or env_cfg.suite] = (0, 0)
            continue
        # past a success the expert holds: the simulator's success must not end the episode then
        holding = cfg.post_success_steps > 0
        task_env = replace(
            env_cfg,
            task=task,
            terminate_on_success=env_cfg.terminate_on_success and not holding,
            max_episode_steps=env_cfg.max_episode_steps + cfg.post_success_steps,
        )
        with make_env(task_env) as env:
            if writer is None:
                writer = LeRobotDatasetWriter(
                    out_dir, cfg.fps, dataset_features(env), env_cfg.suite, cfg.video
                )
            if bar is None:
                total = cfg.episodes_per_task * len(tasks)
                bar = tqdm(
                    total=total,
                    initial=sum(done.values()),
                    desc="episodes" if cfg.policy else "demos",
                    unit="ep",
                    disable=not progress,
                )
            bar.set_description(f"{'episodes' if cfg.policy else 'demos'} {task or env_cfg.suite}")
            task_cfg = replace(cfg, first_state_id=next_state.get(task or "", cfg.first_state_id))
            kept, failed = collect_episodes(
                env, writer, wanted, task_cfg, bar, task or "", max_steps=env_cfg.max_episode_steps
            )
        stats.per_task[task or env_cfg.suite] = (kept, failed)
        stats.episodes += kept
        stats.failures += failed
    if bar is not None:
        bar.close()
    if writer is None:
        raise UserError("nothing to collect")
    writer.finalize()
    stats.frames = writer.num_frames
    stats.seconds = time.perf_counter() - begin
    return stats
