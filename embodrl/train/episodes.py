"""Run a fixed, seeded set of episodes with any action function; collect stats and video frames."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from tensordict import TensorDict
from tqdm import tqdm

from embodrl.sims.base import VecEnv

ActFn = Callable[[TensorDict], torch.Tensor]  # obs [N] -> actions [N, C, A]
NextEpisode = Callable[[int], int]  # free env id -> episode id to play there next; -1: leave it idle
EpisodeEndFn = Callable[[int, int, bool], None]  # (env id, episode id, success) of a finished episode


def share(outcomes: list[bool]) -> float:
    """The fraction of episodes with the outcome (0 without episodes)."""
    return float(np.mean(outcomes)) if outcomes else 0.0


@dataclass
class EpisodeResults:
    """Per-episode outcomes, in the order of their initial-state ids."""

    success: list[bool] = field(default_factory=list)
    length: list[int] = field(default_factory=list)  # env steps (actions executed)
    ret: list[float] = field(default_factory=list)
    instruction: list[str] = field(default_factory=list)
    task: list[str] = field(default_factory=list)  # "" where the env names no tasks
    flags: dict[str, list[bool]] = field(default_factory=dict)  # the env's episode flags, by name
    frames: dict[int, list[np.ndarray]] = field(default_factory=dict)  # episode id -> video frames

    @property
    def success_rate(self) -> float:
        return share(self.success)

    def confidence_interval(self, z: float = 1.96) -> tuple[float, float]:
        """Wilson score interval for the success rate (95% by default)."""
        n = len(self.success)
        if n == 0:
            return (0.0, 1.0)
        p = self.success_rate
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return (max(0.0, centre - half), min(1.0, centre + half))

    def per_instruction(self, outcomes: list[bool] | None = None) -> dict[str, float]:
        """The share of each instruction's episodes with `outcomes` (default: success)."""
        return _shares_by(self.instruction, self.success if outcomes is None else outcomes)

    def per_task(self, outcomes: list[bool] | None = None) -> dict[str, float]:
        """The share of each task's episodes with `outcomes` (default: success); {} for single-task envs."""
        if not any(self.task):
            return {}
        return _shares_by(self.task, self.success if outcomes is None else outcomes)


def _shares_by(groups: list[str], outcomes: list[bool]) -> dict[str, float]:
    out: dict[str, list[bool]] = {}
    for group, ok in zip(groups, outcomes, strict=True):
        out.setdefault(group, []).append(ok)
    return {group: share(v) for group, v in sorted(out.items())}


def fixed_schedule(num_envs: int, num_episodes: int) -> NextEpisode:
    """Env i plays episodes i, i+N, i+2N, ... of [0, num_episodes), then idles."""
    queue = [list(range(i, num_episodes, num_envs)) for i in range(num_envs)]
    return lambda env_id: queue[env_id].pop(0) if queue[env_id] else -1


def run_episodes(
    env: VecEnv,
    act: ActFn,
    num_episodes: int,
    record: int = 0,
    first_state_id: int = 0,
    progress: bool = False,
    next_episode: NextEpisode | None = None,
    on_episode_end: EpisodeEndFn | None = None,
) -> EpisodeResults:
    """Play episodes from initial states first_state_id + [0, num_episodes) and record the first `record`.

    Env i plays episodes i, i+N, i+2N, ...: the set of episodes is fixed by the ids, so results do
    not depend on which episodes happen to finish first. A `next_episode` schedule replaces that
    assignment (it is asked for every free env once all of a step's finished episodes are reported to
    `on_episode_end`); then `num_episodes` only sizes the progress bar and the run ends when all envs idle.
    """
    n = env.num_envs
    next_episode = next_episode or fixed_schedule(n, num_episodes)
    current = [next_episode(i) for i in range(n)]  # episode id per env; -1: idle
    results = {}
    ret = torch.zeros(n)
    length = torch.zeros(n, dtype=torch.long)
    frames: dict[int, list[np.ndarray]] = {e: [] for e in range(min(record, num_episodes))}

    def start(env_ids: list[int]) -> TensorDict:  # envs idle from the start sit on the first state
        ids = torch.tensor([first_state_id + max(current[i], 0) for i in env_ids])
        return env.reset_to(ids, torch.tensor(env_ids))

    task_table = env.instruction_tasks
    obs = start(list(range(n)))
    bar = tqdm(total=num_episodes, desc="episodes", unit="ep", disable=not progress, leave=False)
    while any(e >= 0 for e in current):
        recording = [i for i in range(n) if current[i] in frames]
        if recording:
            for i, frame in zip(recording, env.render(torch.tensor(recording)).numpy(), strict=True):
                frames[current[i]].append(frame)
        instructions = env.instructions(obs["task_id"]) if "task_id" in obs else [""] * n
        tasks = (
            [task_table[i] for i in obs["task_id"].tolist()] if task_table and "task_id" in obs else [""] * n
        )
        res = env.step(act(obs))
        ret += res.reward.sum(-1).cpu()
        length += res.steps_executed.cpu()
        finished = res.done.cpu().nonzero().flatten().tolist()
        flags = res.episode_flags.cpu() if finished else None
        for i in finished:
            if current[i] >= 0 and current[i] not in results:
                ok = bool(res.success[i])
                episode_flags = {name: bool(flag[i]) for name, flag in flags.items()}
                results[current[i]] = (
                    ok,
                    int(length[i]),
                    float(ret[i]),
                    instructions[i],
                    tasks[i],
                    episode_flags,
                )
                if on_episode_end is not None:
                    on_episode_end(i, current[i], ok)
                bar.update(1)
            ret[i], length[i] = 0.0, 0
        for i in finished:
            current[i] = next_episode(i)
        restart = [i for i in finished if current[i] >= 0]  # envs left idle keep the env's own auto-reset
        obs = start(restart) if restart else res.obs
    bar.close()
    out = EpisodeResults(frames=frames)
    for e in sorted(results):
        ok, steps, r, text, task, episode_flags = results[e]
        out.success.append(ok)
        out.length.append(steps)
        out.ret.append(r)
        out.instruction.append(text)
        out.task.append(task)
        for name, flag in episode_flags.items():
            out.flags.setdefault(name, []).append(flag)
    return out
