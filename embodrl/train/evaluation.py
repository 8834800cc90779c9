"""Evaluate a policy on a fixed, seeded set of episodes: success with a 95% CI, lengths, videos."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from embodrl.sims.base import VecEnv
from embodrl.train.episodes import EpisodeResults, run_episodes, share
from embodrl.train.video import write_video


@contextmanager
def seeded_torch_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Inside: torch's RNG (the CPU's and `device`'s) seeded with `seed`; after: as it was before."""
    accelerators = [device] if device.type != "cpu" else []
    device_type = device.type if accelerators else None
    with torch.random.fork_rng(accelerators, device_type=device_type):
        torch.manual_seed(seed)
        yield


@contextmanager
def in_eval_mode(policy: torch.nn.Module) -> Iterator[None]:
    """Inside: `policy` in eval mode; after: back in the mode it was in (training, for a training run)."""
    was_training = policy.training
    policy.eval()
    try:
        yield
    finally:
        policy.train(was_training)


def evaluate_policy(
    policy: torch.nn.Module,
    env: VecEnv,
    episodes: int,
    record: int = 0,
    video_dir: Path | None = None,
    deterministic: bool = True,
    progress: bool = False,
    seed: int = 0,
    first_state_id: int = 0,
) -> EpisodeResults:
    """Play episodes from initial states first_state_id + [0, episodes); write the first `record` as mp4
    into video_dir.

    `deterministic` drops the policy's exploration noise, not every random draw: policies that denoise
    an action still start from sampled noise. Those draws come from torch's RNG seeded with `seed` inside
    a fork, so the result is a function of the weights and the episodes (two evaluations of one
    checkpoint agree) and the caller's random stream is left as it was.
    """
    with in_eval_mode(policy), seeded_torch_rng(seed, next(policy.parameters()).device):
        results = run_episodes(
            env,
            lambda obs: policy.act(obs, deterministic=deterministic).actions,
            episodes,
            record=record,
            first_state_id=first_state_id,
            progress=progress,
        )
    if video_dir is not None:
        for episode, frames in results.frames.items():
            if frames:
                write_video(video_dir / f"episode_{episode:03d}.mp4", frames)
    return results


def summarize(results: EpisodeResults) -> dict:
    """JSON-ready summary: success rate with its 95% Wilson interval, lengths, returns, per instruction and
    per task (multi-task suites); the share of episodes with each of the env's episode flags, overall, per
    instruction and per task."""
    lo, hi = results.confidence_interval()
    n = max(len(results.success), 1)
    return {
        "episodes": len(results.success),
        "success_rate": results.success_rate,
        "success_ci95": [lo, hi],
        "mean_length": sum(results.length) / n,
        "mean_return": sum(results.ret) / n,
        "per_instruction": results.per_instruction(),
        "per_task": results.per_task(),
        "flags": {
            name: {
                "rate": share(values),
                "per_instruction": results.per_instruction(values),
                "per_task": results.per_task(values),
            }
            for name, values in results.flags.items()
        },
    }


def eval_metrics(results: EpisodeResults) -> dict[str, float]:
    """The scalars logged as eval/* each evaluation (eval/<flag> for each episode flag, eval/task/<task>
    for each task's success in multi-task suites)."""
    summary = summarize(results)
    return {
        "eval/success": summary["success_rate"],
        "eval/length": summary["mean_length"],
        "eval/return": summary["mean_return"],
        **{f"eval/{name}": flag["rate"] for name, flag in summary["flags"].items()},
        **{f"eval/task/{task}": rate for task, rate in summary["per_task"].items()},
    }
