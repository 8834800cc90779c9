"""`embodrl eval --demos`: replay recorded demos in the env and compare the policy's actions with theirs.

A policy that fits its demos yet fails in closed loop either sees something at run time that differs from
what it was trained on (a sim/data mismatch: codec, camera, normalization) or drifts off the demos'
states, where it never learned what to do (compounding error). Replaying each demo from its recorded
initial state with its recorded actions puts the env in the demo's states; the policy's action error
against the demo's is then measured twice per step, on the env's own observations and on the dataset's
frames, with the same sampling noise. Equal errors rule the mismatch out; a gap measures it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from embodrl.data.chunk_dataset import ActionChunkDataset, collate_chunks
from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.errors import UserError
from embodrl.obs_keys import IMAGE_KEYS
from embodrl.policies.base import Policy
from embodrl.sims.base import VecEnv
from embodrl.train.evaluation import seeded_torch_rng


@dataclass
class ReplayReport:
    """Means over every replayed step of every episode; action errors per action element of the chunks'
    steps inside the episode."""

    episodes: int
    steps: int
    error_on_env_obs: float  # the policy's deterministic chunk against the demo's, on the env's observations
    error_on_dataset_frames: float  # the same on the dataset's recorded observations
    env_vs_dataset_action_gap: float  # |a_env - a_dataset|: what the observation difference alone changes
    # error_on_env_obs per action dimension, named after the env's action spec (dim_<i> without names):
    # a policy that tracks the arm yet mistimes the gripper fails where the mean error looks small
    error_per_dimension: dict[str, float]
    camera_difference: float | None  # mean |render - recorded frame| in 0-255 units; None without cameras
    max_state_drift: float | None  # max |env state - recorded state|: 0 when the replay is exact

    def as_dict(self) -> dict:
        return asdict(self)


def replayable_episodes(dataset: LeRobotDataset, env_task: str | None) -> list[int]:
    """Episodes of `dataset` recorded in an env built for `env_task`, which its initial state ids index."""
    info = dataset.episodes
    if "init_state_id" not in info:
        raise UserError(
            f"dataset {dataset.root} does not record the episodes' initial state ids (collected by another "
            "tool or an older embodrl); recollect it with `embodrl collect` to replay it"
        )
    tasks = info.get("env_task", [""] * dataset.num_episodes)
    wanted = env_task or ""
    episodes = [e for e in range(dataset.num_episodes) if (tasks[e] or "") == wanted]
    if not episodes:
        raise UserError(
            f"no episode of {dataset.root} was recorded with env.task={wanted or None!r}; it has "
            f"env.task in {sorted({t or 'null' for t in tasks})}: pass env.task=... to match"
        )
    return episodes


def _seeded_actions(policy: Policy, obs, seed: int, device: torch.device) -> torch.Tensor:
    """The deterministic action chunk [n, C, A] on the CPU, drawn under `seed`: heads that denoise an action
    draw their initial noise even when deterministic (on the policy's device), and the same draw for the
    env's and the dataset's observations keeps it from counting as an observation difference."""
    with seeded_torch_rng(seed, device):
        return policy.act(obs, deterministic=True).actions.cpu()


def replay_demos(
    policy: Policy,
    env: VecEnv,
    dataset: LeRobotDataset,
    episodes: list[int],
    seed: int = 0,
) -> ReplayReport:
    """Replay `episodes` of `dataset` in `env`, env.num_envs at a time, one recorded action per step."""
    cfg = policy.cfg
    keys = [k for k in cfg.read_keys if k != "task_id"]  # the critic's too: act() evaluates it
    has_state = "state" not in keys and "observation.state" in dataset.features
    chunks = ActionChunkDataset(
        dataset,
        cfg.chunk_size,
        obs_keys=keys + (["state"] if has_state else []),
        action_dim=cfg.action_dim,
        instruction_table=env.instruction_table,
        episodes=episodes,
    )
    cameras = [k for k in keys if k in IMAGE_KEYS]
    sums = {"env": 0.0, "dataset": 0.0, "gap": 0.0, "camera": 0.0}
    per_dimension = torch.zeros(cfg.action_dim)
    steps, elements, drift = 0, 0, None
    device = next(policy.parameters()).device
    policy.eval()
    for first in range(0, len(episodes), env.num_envs):
        group = episodes[first : first + env.num_envs]
        ranges = [dataset.episode_range(e) for e in group]
        state_ids = torch.tensor([dataset.episodes["init_state_id"][e] for e in group])
        obs = env.reset_to(state_ids, torch.arange(len(group)))
        for t in range(max(stop - start for start, stop in ranges)):
            alive = [i for i, (start, stop) in enumerate(ranges) if start + t < stop]
            recorded = collate_chunks([chunks[ranges[i][0] + t] for i in alive])
            live = obs[torch.tensor(alive, device=obs.device)].to(device)
            on_env = _seeded_actions(policy, live, seed + steps, device)
            on_dataset = _seeded_actions(policy, recorded.to(device), seed + steps, device)
            real = ~recorded["action_is_pad"][:, :, None]  # [n, C, 1]: steps inside the episode
            demo = recorded["action"]
            env_error = (on_env - demo).abs() * real
            sums["env"] += env_error.sum().item()
            per_dimension += env_error.sum(dim=(0, 1))
            sums["dataset"] += ((on_dataset - demo).abs() * real).sum().item()
            sums["gap"] += ((on_env - on_dataset).abs() * real).sum().item()
            elements += real.sum().item() * demo.shape[-1]
            for key in cameras:
                difference = (live[key].float().cpu() - recorded[key].float()).abs().mean().item()
                sums["camera"] += difference * len(alive) / len(cameras)
            if "state" in recorded.keys() and "state" in live.keys():
                step_drift = (live["state"].float().cpu() - recorded["state"]).abs().max().item()
                drift = max(drift or 0.0, step_drift)
            steps += len(alive)
            actions = torch.zeros(env.num_envs, 1, env.action_spec.dim)
            actions[torch.tensor(alive), 0] = demo[:, 0]
            obs = env.step(actions.to(env.device)).obs
    named = env.action_spec.names[: cfg.action_dim]  # a policy may pad actions past the env's dims
    names = (*named, *(f"dim_{i}" for i in range(len(named), cfg.action_dim)))
    real_steps = elements / cfg.action_dim
    return ReplayReport(
        episodes=len(episodes),
        steps=steps,
        error_on_env_obs=sums["env"] / elements,
        error_on_dataset_frames=sums["dataset"] / elements,
        env_vs_dataset_action_gap=sums["gap"] / elements,
        error_per_dimension={n: v / real_steps for n, v in zip(names, per_dimension.tolist(), strict=True)},
        camera_difference=sums["camera"] / steps if cameras else None,
        max_state_drift=drift,
    )
