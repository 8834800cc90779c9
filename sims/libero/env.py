"""LIBERO suites as an embodrl VecEnv, through the standard `libero.libero` API.

Each env is one `OffScreenRenderEnv` (robosuite 1.4, Panda, OSC_POSE control at 20 Hz) for one
task; with env.task unset the suite's tasks are laid out in contiguous blocks (env i runs task
i * T // N), so with num_envs = T * group_size every GRPO group shares a task. `reset_to(s)` loads
the task's official initial state s (LIBERO ships 50 per task). Observations follow the OpenVLA /
openpi LIBERO convention: images rotated 180 degrees, `state` = eef position, eef axis-angle,
gripper finger positions (8-D). Actions are LIBERO's 7-D EE deltas in [-1, 1], gripper +1 closes.
LIBERO has only a success predicate, so rewards are sparse (1 on the success step). Envs are
split over `env.num_threads` worker processes (0: one per core); one worker means in-process.
env.randomize applies the axes of LIBERO_AXES (sims/libero/perturb.py); with the instruction axis the
instruction table holds every task's text at each level up to the largest (task id = task + T * level).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from tensordict import TensorDict

from embodrl.errors import UserError
from embodrl.obs_keys import IMAGE_KEYS, RGB
from embodrl.sims.base import ActionSpec, StepResult, TensorSpec, VecEnv
from embodrl.sims.config import EnvConfig
from embodrl.sims.episode_draws import level_of
from embodrl.sims.libero.loader import SUITES, base_suite, load_suite, select_tasks
from embodrl.sims.libero.paraphrase import load_paraphrases, paraphrase
from embodrl.sims.libero.task_env import STATE_DIM, TaskEnvSpec
from embodrl.sims.libero.workers import LocalGroup, ProcessGroup


class LiberoVecEnv(VecEnv):
    """N LIBERO task envs, in process or across worker processes, behind the VecEnv contract."""

    def __init__(self, cfg: EnvConfig, device: str = "cpu"):
        if cfg.reward != "sparse":
            raise UserError("LIBERO tasks define only success: set env.reward=sparse")
        if cfg.control_mode != "ee_delta":
            raise UserError("LIBERO uses end-effector delta control: set env.control_mode=ee_delta")
        os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering for robosuite (and its workers)
        tasks = load_suite(cfg.suite, cfg.libero_assets)
        chosen = select_tasks(tasks, cfg.task, cfg.suite)
        self.cfg = cfg
        self.num_envs = cfg.num_envs
        self.device = torch.device(device)
        self._instructions = [t.language for t in tasks]
        self._task_names = [t.name for t in tasks]
        if cfg.randomize.instruction > 0:
            unseen = load_paraphrases(SUITES[base_suite(cfg.suite)])
            top = level_of(cfg.randomize.instruction)
            self._instructions = [
                paraphrase(t.language, unseen[t.name], level) for level in range(top + 1) for t in tasks
            ]
        task_of_env = [chosen[i * len(chosen) // cfg.num_envs] for i in range(cfg.num_envs)]
        self._num_init = min(len(tasks[t].init_states) for t in task_of_env)
        cameras = IMAGE_KEYS if cfg.wrist_camera else (RGB,)
        self._cameras = cameras if cfg.obs_mode == "rgb" else ()
        specs = [
            TaskEnvSpec(
                task_id=t,
                bddl_file=tasks[t].bddl_file,
                init_states=np.asarray(tasks[t].init_states),
                image_size=cfg.image_size,
                cameras=self._cameras,
                max_episode_steps=cfg.max_episode_steps,
                terminate_on_success=cfg.terminate_on_success,
                randomize=cfg.randomize,
                num_tasks=len(tasks),
            )
            for t in task_of_env
        ]
        workers = min(cfg.num_envs, cfg.num_threads or os.cpu_count() or 1)
        bounds = [i * cfg.num_envs // workers for i in range(workers + 1)]
        self._slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        group = LocalGroup if workers == 1 else ProcessGroup
        self._groups = [group(specs[sl]) for sl in self._slices]
        self._rng = np.random.default_rng(cfg.seed)
        self._obs: list[dict[str, np.ndarray]] = [{} for _ in range(cfg.num_envs)]
        self.reset(seed=cfg.seed)

    @property
    def action_spec(self) -> ActionSpec:
        return ActionSpec(7, names=("dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper"))

    @property
    def observation_spec(self) -> dict[str, TensorSpec]:
        size = self.cfg.image_size
        spec = {key: TensorSpec((size, size, 3), torch.uint8) for key in self._cameras}
        spec["state"] = TensorSpec((STATE_DIM,), torch.float32)
        spec["task_id"] = TensorSpec((), torch.int64)
        return spec

    @property
    def instruction_table(self) -> list[str]:
        return self._instructions

    @property
    def instruction_tasks(self) -> list[str]:
        # a perturbed table repeats the tasks once per instruction level (task id = task + T * level)
        return self._task_names * (len(self._instructions) // len(self._task_names))

    @property
    def num_init_states(self) -> int:
        return self._num_init

    def _call(self, method: str, args: list[tuple]) -> list:
        """Call `method` on every env (args[i] for env i) across all groups, in parallel."""
        for group, sl in zip(self._groups, self._slices, strict=True):
            group.submit(method, args[sl])
        return [out for group in self._groups for out in group.result()]

    def _obs_td(self, obs: list[dict[str, np.ndarray]]) -> TensorDict:
        data = {key: torch.as_tensor(np.stack([o[key] for o in obs])) for key in obs[0]}
        return TensorDict(data, batch_size=[self.num_envs]).to(self.device)

    def _random_states(self) -> list[int]:
        return self._rng.integers(self._num_init, size=self.num_envs).tolist()

    def reset(self, seed: int | None = None, options: dict | None = None) -> TensorDict:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._obs = self._call("reset_to", [(s,) for s in self._random_states()])
        return self._obs_td(self._obs)

    def reset_to(self, state_ids: torch.Tensor, env_ids: torch.Tensor | None = None) -> TensorDict:
        env_ids = self.check_state_ids(state_ids, env_ids)
        args: list[tuple | None] = [None] * self.num_envs
        for i, sid in zip(env_ids.tolist(), torch.as_tensor(state_ids).flatten().tolist(), strict=True):
            args[i] = (int(sid),)
        for i, obs in enumerate(self._call("reset_to", args)):
            if obs is not None:
                self._obs[i] = obs
        return self._obs_td(self._obs)

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = self.check_actions(actions).cpu().numpy().astype(np.float64)  # [N, C, 7]
        outs = self._call("step", list(zip(actions, self._random_states(), strict=True)))
        self._obs = [o["obs"] for o in outs]
        as_t = lambda key, dtype: torch.as_tensor(np.array([o[key] for o in outs]), dtype=dtype)
        return StepResult.build(
            obs=self._obs_td(self._obs),
            reward=as_t("reward", torch.float32).to(self.device),
            terminated=as_t("terminated", torch.bool).to(self.device),
            truncated=as_t("truncated", torch.bool).to(self.device),
            success=as_t("success", torch.bool).to(self.device),
            final_obs=self._obs_td([o["final"] for o in outs]),
            steps_executed=as_t("executed", torch.int64).to(self.device),
            device=self.device,
        )

    def render(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        ids = range(self.num_envs) if env_ids is None else torch.as_tensor(env_ids).flatten().tolist()
        frames = self._call("render", [() if i in ids else None for i in range(self.num_envs)])
        return torch.as_tensor(np.stack([frames[i] for i in ids]), dtype=torch.uint8)

    def close(self) -> None:
        for group in self._groups:
            group.close()
        self._groups = []


def make_libero(cfg: EnvConfig, device: str = "cpu") -> LiberoVecEnv:
    """Build `cfg.num_envs` envs of the LIBERO suite `cfg.suite` (e.g. libero-spatial)."""
    return LiberoVecEnv(cfg, device=device)
