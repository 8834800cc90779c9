"""ManiSkill3 tasks as an embodrl VecEnv (GPU-batched on CUDA, one CPU sim per env otherwise).

On a CUDA device one ManiSkill env holds all N sub-envs (physx_cuda; tensors stay on the GPU). On
CPU, ManiSkill refuses num_envs > 1, so N single-env instances are stepped in turn (process-level
parallelism is the engine's env workers' job). Both are "shards" of consecutive envs here.

Mapping: `state` = the robot's proprioception (agent qpos, qvel, and the TCP pose when the task
reports it); `privileged` = the whole simulator state (`env.get_state()`: every actor and
articulation), for critics; `rgb` = the task's base camera, `wrist_rgb` = the Panda hand camera.
Actions [-1, 1] map affinely onto the controller's bounds; the gripper sign is flipped so that +1
closes, as in LIBERO / OpenVLA and the tabletop suite (ManiSkill's +1 opens).
"""

from __future__ import annotations

import gymnasium as gym
import torch
from tensordict import TensorDict

from embodrl.errors import UserError
from embodrl.sims.base import ActionSpec, StepResult, TensorSpec, VecEnv
from embodrl.sims.config import EnvConfig
from embodrl.sims.maniskill.tasks import (
    VULKAN_ERRORS,
    VULKAN_HINT,
    check_gpu_physx,
    check_task,
    instruction,
    make_kwargs,
)

NUM_INIT_STATES = 2**31 - 1  # reset_to(id) is a reset seeded with id: every seed is an initial state
WRIST_CAMERA = "hand_camera"


def _gripper_dims(agent) -> list[int]:
    """Indices of the gripper controller's dims within the combined action."""
    dims, start = [], 0
    for name, controller in agent.controller.controllers.items():
        n = controller.single_action_space.shape[0]
        if name == "gripper":
            dims += range(start, start + n)
        start += n
    return dims


class ManiSkillVecEnv(VecEnv):
    """One ManiSkill3 task, N envs, behind the VecEnv contract."""

    def __init__(self, cfg: EnvConfig, device: str = "cpu"):
        check_task(cfg)
        self.cfg = cfg
        self.num_envs = cfg.num_envs
        gpu = torch.device(device).type == "cuda"
        if gpu:
            check_gpu_physx()
        sizes = [cfg.num_envs] if gpu else [1] * cfg.num_envs
        self.shards = [self._make(size, "physx_cuda" if gpu else "physx_cpu") for size in sizes]
        first = self.shards[0].unwrapped
        self.device = torch.device(first.device)
        starts = [0, *torch.tensor(sizes).cumsum(0).tolist()[:-1]]
        self._slices = [slice(i, i + s) for i, s in zip(starts, sizes, strict=True)]
        space = first.single_action_space
        self._act_low = torch.as_tensor(space.low, dtype=torch.float32, device=self.device)
        self._act_high = torch.as_tensor(space.high, dtype=torch.float32, device=self.device)
        self._flip = torch.ones(space.shape[0], device=self.device)
        self._flip[_gripper_dims(first.agent)] = -1.0
        self.reset(seed=cfg.seed)  # also fixes observation_spec

    def _make(self, num_envs: int, sim_backend: str) -> gym.Env:
        try:
            return gym.make(self.cfg.task, **make_kwargs(self.cfg, num_envs, sim_backend))
        except RuntimeError as exc:
            if any(s in str(exc) for s in VULKAN_ERRORS):
                raise UserError(f"{VULKAN_HINT} ({exc})") from exc
            raise

    @property
    def action_spec(self) -> ActionSpec:
        return ActionSpec(dim=self._act_low.shape[0])

    @property
    def observation_spec(self) -> dict[str, TensorSpec]:
        return {k: TensorSpec(tuple(v.shape[1:]), v.dtype) for k, v in self._obs.items()}

    @property
    def instruction_table(self) -> list[str]:
        return [instruction(self.cfg.task)]

    @property
    def num_init_states(self) -> int:
        return NUM_INIT_STATES

    def _convert(self, shard: gym.Env, raw: dict) -> dict[str, torch.Tensor]:
        """ManiSkill's observation dict for one shard -> our keys, each [k, ...]."""
        agent, extra = raw["agent"], raw["extra"]
        proprio = [agent[k].flatten(1) for k in agent] + ([extra["tcp_pose"]] if "tcp_pose" in extra else [])
        out = {
            "state": torch.cat(proprio, -1).float(),  # [k, S]
            "privileged": shard.unwrapped.get_state().float(),  # [k, P]
        }
        if self.cfg.obs_mode == "rgb":
            cams = raw["sensor_data"]
            main = next(name for name in cams if name != WRIST_CAMERA)
            out["rgb"] = cams[main]["rgb"]  # [k, H, W, 3] uint8
            if self.cfg.wrist_camera:
                out["wrist_rgb"] = cams[WRIST_CAMERA]["rgb"]
        out["task_id"] = torch.zeros(out["state"].shape[0], dtype=torch.long, device=self.device)
        return out

    def _write(self, obs: TensorDict, rows: torch.Tensor, part: dict[str, torch.Tensor]) -> None:
        for key, value in part.items():
            obs[key][rows] = value.to(self.device)

    def reset(self, seed: int | None = None, options: dict | None = None) -> TensorDict:
        parts = []
        for shard, sl in zip(self.shards, self._slices, strict=True):
            seeds = None if seed is None else list(range(seed + sl.start, seed + sl.stop))
            raw, _ = shard.reset(seed=seeds[0] if seeds and len(seeds) == 1 else seeds)
            parts.append(self._convert(shard, raw))
        self._obs = TensorDict(
            {k: torch.cat([p[k] for p in parts]).to(self.device) for k in parts[0]},
            batch_size=[self.num_envs],
            device=self.device,
        )
        return self._obs.clone()

    def reset_to(self, state_ids: torch.Tensor, env_ids: torch.Tensor | None = None) -> TensorDict:
        env_ids = self.check_state_ids(state_ids, env_ids)
        state_ids = torch.as_tensor(state_ids).flatten()
        for shard, sl in zip(self.shards, self._slices, strict=True):
            local = (env_ids >= sl.start) & (env_ids < sl.stop)
            for sid in state_ids[local].unique().tolist():
                idx = env_ids[local][state_ids[local] == sid] - sl.start
                part = self._reset_group(shard, idx.to(self.device), int(sid))
                self._write(self._obs, idx + sl.start, {k: v[idx] for k, v in part.items()})
        return self._obs.clone()

    def _reset_group(self, shard: gym.Env, idx: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
        """Reset shard envs `idx` to the state a reset seeded with `seed` gives, identically."""
        raw, _ = shard.reset(seed=seed, options={"env_idx": idx[:1]})
        if len(idx) > 1:  # a batched seeded reset draws different states per env: copy the first
            state = shard.unwrapped.get_state()[idx[:1]].repeat(len(idx) - 1, 1)
            raw, _ = shard.reset(options={"env_idx": idx[1:], "reset_to_env_states": {"env_states": state}})
        return self._convert(shard, raw)

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = self.check_actions(actions).to(self.device)  # [N, C, A]
        actions = self._act_low + (actions * self._flip + 1.0) * 0.5 * (self._act_high - self._act_low)
        n, chunk = actions.shape[:2]
        zeros = lambda dtype: torch.zeros(n, dtype=dtype, device=self.device)
        reward = torch.zeros(n, chunk, device=self.device)
        terminated, truncated, success = zeros(torch.bool), zeros(torch.bool), zeros(torch.bool)
        executed = zeros(torch.long)
        final = self._obs.clone()
        for shard, sl in zip(self.shards, self._slices, strict=True):
            running = torch.ones(sl.stop - sl.start, dtype=torch.bool, device=self.device)
            for c in range(chunk):
                raw, r, _, trunc, info = shard.step(actions[sl, c])
                no = torch.zeros_like(running)
                succ = info["success"].to(self.device).bool() if "success" in info else no
                fail = info["fail"].to(self.device).bool() if "fail" in info else no
                term = running & (fail | (succ & self.cfg.terminate_on_success))
                trunc = running & trunc.to(self.device).bool() & ~term
                reward[sl, c] = torch.where(running, r.to(self.device).float(), 0.0)
                executed[sl] += running.long()
                success[sl] |= running & succ
                terminated[sl] |= term
                truncated[sl] |= trunc
                ended = term | trunc
                if ended.any() or c == chunk - 1:  # the latest observation of every env still running
                    rows = torch.arange(sl.start, sl.stop, device=self.device)[running]
                    self._write(final, rows, {k: v[running] for k, v in self._convert(shard, raw).items()})
                running &= ~ended
                if not running.any():
                    break
            self._obs[sl] = final[sl]
            done = (terminated[sl] | truncated[sl]).nonzero().flatten()
            if len(done):
                raw, _ = shard.reset(options={"env_idx": done})
                part = self._convert(shard, raw)
                self._write(self._obs, done + sl.start, {k: v[done] for k, v in part.items()})
        return StepResult.build(
            obs=self._obs.clone(),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=success,
            final_obs=final,
            steps_executed=executed,
            device=self.device,
        )

    def render(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        ids = range(self.num_envs) if env_ids is None else torch.as_tensor(env_ids).flatten().tolist()
        frames: dict[int, torch.Tensor] = {}  # env index -> [H, W, 3]; each shard renders once
        for shard, sl in zip(self.shards, self._slices, strict=True):
            if any(sl.start <= i < sl.stop for i in ids):
                frames.update(zip(range(sl.start, sl.stop), shard.render(), strict=True))
        return torch.stack([frames[i] for i in ids]).to(torch.uint8)

    def close(self) -> None:
        for shard in self.shards:
            shard.close()


def make_maniskill(cfg: EnvConfig, device: str = "cpu") -> ManiSkillVecEnv:
    """Build `cfg.num_envs` envs of the ManiSkill task `cfg.task`."""
    return ManiSkillVecEnv(cfg, device=device)
