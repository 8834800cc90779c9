"""`embodrl play`: play a policy (scripted expert, random, or a checkpoint) and write videos."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from embodrl.config import ExperimentConfig, make_run_dir
from embodrl.errors import UserError
from embodrl.sims.base import VecEnv
from embodrl.sims.registry import make_env
from embodrl.train.episodes import ActFn, run_episodes
from embodrl.train.evaluation import seeded_torch_rng, summarize
from embodrl.train.video import write_video


def action_source(name: str, env: VecEnv, seed: int, device: str = "cpu") -> ActFn:
    """'expert' (the suite's scripted expert), 'random' (uniform in the action bounds) or a checkpoint
    folder (its deterministic actions)."""
    if Path(name).is_dir():
        from embodrl.policies.loading import load_policy
        from embodrl.train.policy_setup import read_prompts_through

        policy = load_policy(name, device=device).eval()
        read_prompts_through(policy, env.instruction_table)
        if policy.cfg.steers:  # a noise-space actor: its actions are decoded by the policy it steers
            steered = load_policy(policy.cfg.steers, device=device).eval()
            return lambda obs: steered.act_from_noise(obs, policy.act(obs, deterministic=True).actions)
        return lambda obs: policy.act(obs, deterministic=True).actions
    if name == "expert":
        return lambda obs: env.expert_actions()[:, None]
    if name == "random":
        gen = torch.Generator().manual_seed(seed)
        spec = env.action_spec
        return lambda obs: (
            spec.low + (spec.high - spec.low) * torch.rand(env.num_envs, 1, spec.dim, generator=gen)
        )
    raise UserError(f"--policy {name!r} is not known; use 'expert', 'random' or a checkpoint folder")


def play(cfg: ExperimentConfig, policy: str, episodes: int, record: int, video_format: str) -> Path:
    """Run `episodes` episodes, write summary.json and `record` videos into a new run folder."""
    if episodes < 1 or record < 0:
        raise UserError("--episodes must be >= 1 and --record >= 0")
    env = make_env(cfg.env, device=cfg.device)
    try:
        act = action_source(policy, env, cfg.seed, cfg.device)
        with seeded_torch_rng(cfg.seed, torch.device(cfg.device)):  # a checkpoint's noise draws repeat
            results = run_episodes(env, act, episodes, record=record, progress=True)
    finally:
        env.close()
    run_dir = make_run_dir(cfg)
    summary = summarize(results)
    for episode, frames in results.frames.items():
        if frames:
            write_video(run_dir / f"episode_{episode:03d}.{video_format}", frames)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir
