"""The tabletop VecEnv: N MuJoCo scenes stepped in a batch, language tasks, scripted experts."""

from __future__ import annotations

import time

import mujoco
import numpy as np
import torch
from tensordict import TensorDict

from embodrl.errors import UserError
from embodrl.sims.base import ActionSpec, StepResult, TensorSpec, VecEnv
from embodrl.sims.config import EnvConfig
from embodrl.sims.tabletop import rewards
from embodrl.sims.tabletop.controller import (
    R_DOWN,
    EEDeltaController,
    dls_step,
    hinge_jacobian,
    rotation_error,
)
from embodrl.sims.tabletop.expert import ScriptedExpert
from embodrl.sims.tabletop.layout import NUM_INIT_STATES, Layout, sample_layout
from embodrl.sims.tabletop.perturb import ActionDelay, Perturbations
from embodrl.sims.tabletop.physics import make_physics
from embodrl.sims.tabletop.render import BatchRenderer
from embodrl.sims.tabletop.scene import (
    ARM_HOME,
    ARM_JOINT_RANGES,
    BUTTON_TOP,
    CUBE_HALF,
    FINGER_OPEN,
    PARK_X,
    SceneIndex,
    build_model,
)
from embodrl.sims.tabletop.tasks import COLOR_NAMES, SUITES, TASK_NAMES, TASKS, instruction_entries

SUBSTEPS = 10  # physics steps of 5 ms per 0.05 s control step
KINDS = ("cube", "target", "plate", "bowl", "button")  # object slots: kind-major, then colour
FLOOR_Z = -0.75
STATE_DIM = 17  # ee pos 3, ee rotation 6 (two columns), gripper gap 1, arm joints 7
PRIVILEGED_DIM = 16 + len(TASK_NAMES)  # main pos 3 + quat 4, goal pos 3, main-ee 3, goal-main 3, task
WRONG_OBJECT = "wrong_object"  # episode flag: the policy moved an object the instruction does not name
MOVABLE = ("cube", "button")  # kinds a policy can displace; the others are mocap bodies
MOVED_CUBE = 0.02  # m from its start counts as moved: far past settling (0.1 mm) and a graze of the hand


def _slot(kind: str, color: int) -> int:
    return KINDS.index(kind) * len(COLOR_NAMES) + color


def _slots(kind: str) -> slice:
    """The object slots of one kind, a colour each."""
    return slice(_slot(kind, 0), _slot(kind, 0) + len(COLOR_NAMES))


def _watched(layout: Layout, named: list[int]) -> np.ndarray:
    """[slots] bool: the movable objects a layout places that the instruction does not name (the parked
    ones wait out of reach)."""
    out = np.zeros(len(KINDS) * len(COLOR_NAMES), bool)
    for kind in MOVABLE:
        out[[_slot(kind, c) for c in layout.objects.get(kind, {})]] = True
    out[named] = False
    return out


EE_DELTA_NAMES = ("dx", "dy", "dz", "droll", "dpitch", "dyaw", "gripper")
# The ee_delta dimensions each end-effector control mode keeps; the others are held at zero.
EE_MODE_DIMS = {
    "ee_delta": list(range(len(EE_DELTA_NAMES))),
    "ee_delta_yaw": [0, 1, 2, 5, 6],
    "ee_delta_pos": [0, 1, 2, 6],
}


class TabletopEnv(VecEnv):
    """Batched tabletop manipulation with language instructions (suites tabletop-basic, tabletop-lang).

    Actions [N, C, 7] in [-1, 1] (values outside are clipped): end-effector delta xyz (2 cm per step
    at 1), delta roll/pitch/yaw (0.1 rad), gripper (-1 open, +1 closed); with control_mode=joint_pos,
    [N, C, 8]: arm joint targets scaled to the joint ranges, then the gripper; with
    control_mode=ee_delta_yaw, [N, C, 5]: delta xyz, delta yaw, gripper (roll and pitch held); with
    control_mode=ee_delta_pos, [N, C, 4]: delta xyz, gripper (the hand keeps pointing down, yaw 0).
    With distractors (tabletop-lang, or env.randomize.distractors), the episode flag `wrong_object`: at
    some control step a cube the instruction does not name moved MOVED_CUBE from its start, or such a
    button was pressed.
    Rewards per executed action: sparse gives 1 where the task is done; dense gives the change in
    task progress plus 1 where done (rewards.py). Observation `state` [N, 17]: ee position, ee
    rotation (first two columns), finger gap / max, arm joints; `privileged` [N, 22]: instructed
    object position and quaternion, goal position, object - ee, goal - object, task one-hot.
    """

    def __init__(self, cfg: EnvConfig, device: str = "cpu"):
        if cfg.suite not in SUITES:
            raise UserError(f"unknown tabletop suite {cfg.suite!r}; valid suites: {', '.join(SUITES)}")
        suite = SUITES[cfg.suite]
        if cfg.task is not None and cfg.task not in suite.tasks:
            raise UserError(
                f"unknown task {cfg.task!r} for suite {suite.name}; valid tasks: {', '.join(suite.tasks)}"
            )
        self.cfg = cfg
        self.num_envs = cfg.num_envs
        self.device = torch.device(device)
        self._distractors = suite.distractors
        self._table = instruction_entries((cfg.task,) if cfg.task else suite.tasks)
        self.model = build_model()
        self.idx = SceneIndex.of(self.model)
        self.physics = make_physics(self.model, cfg.num_envs, cfg.num_threads, cfg.physics_backend)
        # env.randomize: perturbations drawn per episode (None when off: the nominal env, untouched)
        self._perturb = (
            Perturbations(cfg.randomize, self.model, self.idx, self._table) if cfg.randomize.active else None
        )
        # the axes that edit the MjModel give each env a copy of its own
        self._models = self.physics.use_own_models() if self._perturb and self._perturb.model_axes else None
        self._delay = (
            ActionDelay(cfg.num_envs, self._perturb.max_delay, self.action_spec.dim)
            if self._perturb and "latency" in self._perturb.axes
            else None
        )
        # whether some episodes place objects the instruction does not name (the wrong_object flag)
        self._watches = self._distractors or bool(self._perturb and self._perturb.adds_objects)
        self._controller = EEDeltaController(cfg.num_envs, *ARM_JOINT_RANGES.T, ARM_HOME)
        self._expert = ScriptedExpert(cfg.num_envs)
        cameras = (("rgb", "front"), ("wrist_rgb", "wrist")) if cfg.wrist_camera else (("rgb", "front"),)
        self._renderers = {
            key: BatchRenderer(self.model, cfg.image_size, cfg.render_shadows, camera)
            for key, camera in (cameras if cfg.obs_mode == "rgb" else ())
        }
        self._video_renderer: BatchRenderer | None = None
        self._render_seconds = 0.0  # observation rendering since the last pop_timings()
        self._ik_data = mujoco.MjData(self.model)
        self._layout_cache: dict[int, tuple[Layout, np.ndarray]] = {}
        n = cfg.num_envs
        self._instruction = np.zeros(n, dtype=np.int64)
        self._shown = np.zeros(n, dtype=np.int64)  # obs task_id: the instruction's text as given
        self._task = np.zeros(n, dtype=np.int64)
        self._main_slot = np.zeros(n, dtype=np.int64)
        self._goal_slot = np.zeros(n, dtype=np.int64)
        self._steps = np.zeros(n, dtype=np.int64)
        self._progress = np.zeros(n)
        self._state_id = np.zeros(n, dtype=np.int64)  # the initial state each env's episode started from
        self._cube_start = np.zeros((n, len(COLOR_NAMES), 3))  # cube positions at the episode's start
        self._watched = np.zeros((n, len(KINDS) * len(COLOR_NAMES)), bool)  # see _watched
        self._wrong_object = np.zeros(n, bool)  # the episode has moved a watched object
        self._rng = np.random.default_rng(cfg.seed)
        self._cube_xyz = self.idx.cube_qpos[:, None] + np.arange(3)  # [colors, 3] qpos addresses
        self._mocap_of = np.concatenate(
            [self.idx.target_mocap, self.idx.plate_mocap, self.idx.bowl_mocap, self.idx.button_mocap]
        )
        self.reset()

    # ---- specs -------------------------------------------------------------------------------------
    @property
    def action_spec(self) -> ActionSpec:
        if self.cfg.control_mode == "joint_pos":
            return ActionSpec(8, names=tuple(f"joint{i}" for i in range(1, 8)) + ("gripper",))
        dims = EE_MODE_DIMS[self.cfg.control_mode]
        return ActionSpec(len(dims), names=tuple(EE_DELTA_NAMES[i] for i in dims))

    @property
    def observation_spec(self) -> dict[str, TensorSpec]:
        spec = {
            "state": TensorSpec((STATE_DIM,), torch.float32),
            "privileged": TensorSpec((PRIVILEGED_DIM,), torch.float32),
            "task_id": TensorSpec((), torch.int64),
        }
        if self.cfg.obs_mode == "rgb":
            size = self.cfg.image_size
            spec["rgb"] = TensorSpec((size, size, 3), torch.uint8)
            if self.cfg.wrist_camera:
                spec["wrist_rgb"] = TensorSpec((size, size, 3), torch.uint8)
        return spec

    @property
    def instruction_table(self) -> list[str]:
        return self._perturb.shown_table if self._perturb else [e.text for e in self._table]

    @property
    def instruction_tasks(self) -> list[str]:
        # a perturbed table repeats the entries once per instruction level (task id = entry + size * level)
        levels = len(self.instruction_table) // len(self._table)
        return [e.task for e in self._table] * levels

    @property
    def num_init_states(self) -> int:
        return NUM_INIT_STATES

    @property
    def episode_flag_names(self) -> tuple[str, ...]:
        # without distractors only the named objects are placed: the flag could never be set
        return (WRONG_OBJECT,) if self._watches else ()

    # ---- resets ------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict | None = None) -> TensorDict:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._reset_envs(np.arange(self.num_envs), self._draw_state_ids(self.num_envs))
        return self._observe(np.arange(self.num_envs))

    def reset_to(self, state_ids: torch.Tensor, env_ids: torch.Tensor | None = None) -> TensorDict:
        env_ids = self.check_state_ids(state_ids, env_ids)
        self._reset_envs(env_ids.numpy(), torch.as_tensor(state_ids).flatten().numpy())
        return self._observe(np.arange(self.num_envs))

    def _draw_state_ids(self, n: int) -> np.ndarray:
        return self._rng.integers(NUM_INIT_STATES, size=n)

    def _next_state_ids(self, env_ids: np.ndarray) -> np.ndarray:
        """Where finished envs auto-reset to: a function of env i's own seed (env.seed + i, which stage
        configs keep) and the state its episode began from, as a gymnasium env reset with a seed continues
        that seed's stream. So a rollout is fixed by its reset_to ids alone: exact resume, and the same
        episodes whatever the split of the envs into stages."""
        return np.array(
            [
                np.random.default_rng([self.cfg.seed + int(i), int(self._state_id[i])]).integers(
                    NUM_INIT_STATES
                )
                for i in env_ids
            ],
            dtype=np.int64,
        )

    def _layout(self, state_id: int) -> tuple[Layout, np.ndarray]:
        """Layout and the arm's start joints for a state id (cached: the IK solve is the costly part)."""
        if state_id not in self._layout_cache:
            if len(self._layout_cache) >= 10_000:  # bound memory; entries are cheap to recompute
                self._layout_cache.clear()
            layout = sample_layout(state_id, self._table, self._distractors)
            if self._perturb:
                layout = self._perturb.edit_layout(layout, state_id)
            self._layout_cache[state_id] = (layout, self._solve_start_joints(layout.ee_start))
        return self._layout_cache[state_id]

    def _solve_start_joints(self, ee_pos: np.ndarray) -> np.ndarray:
        """Arm joints putting the hand at `ee_pos`, pointing down (kinematics-only DLS iterations)."""
        m, d = self.model, self._ik_data
        d.qpos[self.idx.arm_qpos] = ARM_HOME
        jacp, jacr = np.zeros((3, m.nv)), np.zeros((3, m.nv))
        for _ in range(100):
            mujoco.mj_kinematics(m, d)
            mujoco.mj_comPos(m, d)
            mujoco.mj_jacSite(m, d, jacp, jacr, self.idx.ee_site)
            rot = d.site_xmat[self.idx.ee_site].reshape(1, 3, 3)
            err = np.concatenate(
                [ee_pos - d.site_xpos[self.idx.ee_site], rotation_error(R_DOWN[None], rot)[0]]
            )
            if np.abs(err).max() < 1e-5:
                break
            jac = np.concatenate([jacp, jacr])[None][:, :, self.idx.arm_dof]
            q = d.qpos[self.idx.arm_qpos].copy()
            d.qpos[self.idx.arm_qpos] = np.clip(
                q + dls_step(jac, err[None], q[None], ARM_HOME, damping=0.01, nullspace_gain=0.0)[0],
                *ARM_JOINT_RANGES.T,
            )
        return d.qpos[self.idx.arm_qpos].copy()

    def _reset_envs(self, env_ids: np.ndarray, state_ids: np.ndarray) -> None:
        p, idx = self.physics, self.idx
        p.reset(env_ids)
        for i, sid in zip(env_ids, state_ids, strict=True):
            self._state_id[i] = sid
            layout, arm_q = self._layout(int(sid))
            entry = self._table[layout.instruction]
            spec = TASKS[entry.task]
            self._instruction[i] = layout.instruction
            self._shown[i] = layout.instruction
            if self._perturb:
                self._shown[i] = self._perturb.shown_instruction(layout.instruction, int(sid))
            if self._models is not None:
                self._perturb.edit_model(self._models[i], int(sid))
            # half the cubes' edge, perturbed or not: they start resting on the table
            cube_half = self.physics.model_of(i).geom_size[idx.cube_geom, 2]
            self._task[i] = TASK_NAMES.index(entry.task)
            self._main_slot[i] = _slot(spec.main, entry.main)
            self._goal_slot[i] = _slot(spec.goal, entry.goal) if spec.goal else self._main_slot[i]
            self._watched[i] = _watched(layout, [self._main_slot[i], self._goal_slot[i]])
            p.qpos[i, idx.arm_qpos] = arm_q
            p.qpos[i, idx.finger_qpos] = FINGER_OPEN
            p.ctrl[i, :7] = arm_q
            p.ctrl[i, 7:] = FINGER_OPEN
            p.qvel[i] = 0.0
            cubes = layout.objects.get("cube", {})
            for c, adr in enumerate(idx.cube_qpos):
                if c in cubes:
                    yaw = layout.cube_yaw[c]
                    pose = [*cubes[c], cube_half[c], np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)]
                else:
                    pose = [PARK_X + 0.2 * c, 0.0, FLOOR_Z + CUBE_HALF, 1.0, 0.0, 0.0, 0.0]
                p.qpos[i, adr : adr + 7] = pose
            p.qpos[i, idx.button_qpos] = 0.0
            for k, kind in enumerate(KINDS[1:]):
                placed = layout.objects.get(kind, {})
                for c in range(len(COLOR_NAMES)):
                    mocap = self._mocap_of[k * len(COLOR_NAMES) + c]
                    xyz = placed.get(c, np.array([PARK_X, 0.3 * (k * 4 + c), FLOOR_Z]))
                    p.mocap_pos[i, mocap] = np.append(xyz, 0.0) if len(xyz) == 2 else xyz
        if self._models is not None:
            self.physics.models_edited()
        if self._delay is not None:
            delays = [self._perturb.delay_steps(int(s)) for s in state_ids]
            self._delay.reset(env_ids, np.array(delays), self._hold_action(env_ids))
        p.forward(env_ids)
        self._cube_start[env_ids] = p.qpos[env_ids][:, self._cube_xyz]
        self._wrong_object[env_ids] = False
        ee_pos, ee_rot = self._ee_pose()
        self._controller.reset(env_ids, ee_pos[env_ids], ee_rot[env_ids])
        self._expert.reset(env_ids)
        self._steps[env_ids] = 0
        self._progress[env_ids] = rewards.progress(self._frame())[env_ids]

    # ---- reading the simulation --------------------------------------------------------------------
    def _ee_pose(self) -> tuple[np.ndarray, np.ndarray]:
        site = self.idx.ee_site
        return self.physics.site_xpos[:, site].copy(), self.physics.site_xmat[:, site].reshape(-1, 3, 3)

    def _object_positions(self) -> np.ndarray:
        """[N, slots, 3] positions of every object slot (button slots give the cap's top)."""
        p = self.physics
        cubes = p.qpos[:, self._cube_xyz]  # [N, colors, 3]
        mocap = p.mocap_pos[:, self._mocap_of]  # [N, 4 * colors, 3]
        pos = np.concatenate([cubes, mocap], 1)
        pos[:, _slots("button"), 2] += BUTTON_TOP + p.qpos[:, self.idx.button_qpos]
        return pos

    def _moved_watched(self) -> np.ndarray:
        """[N] bool: a watched object is now away from its start (cubes) or pressed (buttons, as deep as a
        press of the named one counts; a resting cap sinks 5 mm under its own weight)."""
        p = self.physics
        moved = np.zeros_like(self._watched)
        shift = np.linalg.norm(p.qpos[:, self._cube_xyz] - self._cube_start, axis=-1)  # [N, colors]
        moved[:, _slots("cube")] = shift > MOVED_CUBE
        moved[:, _slots("button")] = -p.qpos[:, self.idx.button_qpos] > rewards.PRESS_DEPTH
        return (moved & self._watched).any(-1)

    def _frame(self) -> rewards.TaskFrame:
        ee, _ = self._ee_pose()
        pos = self._object_positions()
        rows = np.arange(self.num_envs)
        main_button = self._main_slot - _slot("button", 0)
        travel = np.where(
            main_button >= 0,
            -self.physics.qpos[rows, self.idx.button_qpos[np.clip(main_button, 0, None)]],
            0.0,
        )
        gap = self.physics.qpos[:, self.idx.finger_qpos].sum(-1)
        cube_color = np.clip(self._main_slot, 0, len(COLOR_NAMES) - 1)
        quat = np.where(
            (self._main_slot < len(COLOR_NAMES))[:, None],  # cube slots come first
            self.physics.qpos[rows[:, None], self.idx.cube_qpos[cube_color][:, None] + np.arange(3, 7)],
            [1.0, 0.0, 0.0, 0.0],
        )
        # q and -q are the same rotation and MuJoCo does not pick one: observe the w >= 0 half so
        # the policy's input does not jump when the integrator flips the sign.
        quat = np.where(quat[:, :1] < 0, -quat, quat)
        main, goal = pos[rows, self._main_slot], pos[rows, self._goal_slot]
        return rewards.TaskFrame(self._task, ee, main, quat, goal, travel, gap)

    def _observe(self, ids: np.ndarray) -> TensorDict:
        """Observations of envs `ids` as a TensorDict [len(ids)]."""
        p, idx = self.physics, self.idx
        ee_pos, ee_rot = self._ee_pose()
        frame = self._frame()
        gap = frame.gripper_gap[:, None] / (2 * FINGER_OPEN)
        state = np.concatenate([ee_pos, ee_rot[:, :, :2].reshape(-1, 6), gap, p.qpos[:, idx.arm_qpos]], -1)
        state, main, goal = state[ids], frame.main[ids], frame.goal[ids]
        if self._perturb:
            episodes, steps = self._state_id[ids], self._steps[ids]
            state = self._perturb.noisy_state(state, episodes, steps)
            same = self._goal_slot[ids] == self._main_slot[ids]
            main, goal = self._perturb.noisy_objects(main, goal, same, episodes, steps)
        privileged = np.concatenate(
            [
                main,
                frame.main_quat[ids],
                goal,
                main - ee_pos[ids],
                goal - main,
                np.eye(len(TASK_NAMES))[self._task[ids]],
            ],
            -1,
        )
        out = {
            "state": torch.from_numpy(state.astype(np.float32)),
            "privileged": torch.from_numpy(privileged.astype(np.float32)),
            "task_id": torch.from_numpy(self._shown[ids].copy()),
        }
        start = time.perf_counter()
        for key, renderer in self._renderers.items():
            out[key] = torch.from_numpy(renderer.render(p, ids))
        self._render_seconds += time.perf_counter() - start
        return TensorDict(out, batch_size=[len(ids)], device=self.device)

    def pop_timings(self) -> dict[str, float]:
        seconds, self._render_seconds = self._render_seconds, 0.0
        return {"render": seconds} if self._renderers else {}

    # ---- stepping ----------------------------------------------------------------------------------
    def _apply(self, action: np.ndarray) -> None:
        """Set actuator targets for one control step from actions [N, A]."""
        p, idx = self.physics, self.idx
        q = p.qpos[:, idx.arm_qpos]
        if self.cfg.control_mode == "joint_pos":
            low, high = ARM_JOINT_RANGES.T
            p.ctrl[:, :7] = low + (action[:, :7] + 1.0) * 0.5 * (high - low)
        else:
            if self.cfg.control_mode != "ee_delta":  # the dimensions the mode drops are held at zero
                full = np.zeros((action.shape[0], len(EE_DELTA_NAMES)), dtype=action.dtype)
                full[:, EE_MODE_DIMS[self.cfg.control_mode]] = action
                action = full
            ee_pos, ee_rot = self._ee_pose()
            jac = hinge_jacobian(p.xanchor[:, idx.arm_joint], p.xaxis[:, idx.arm_joint], ee_pos)
            p.ctrl[:, :7] = self._controller.joint_targets(action, q, ee_pos, ee_rot, jac)
        p.ctrl[:, 7:] = (FINGER_OPEN * (1.0 - action[:, -1:]) * 0.5).repeat(2, 1)

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = self.check_actions(actions).cpu().numpy()  # [N, C, A]
        n, chunk = actions.shape[:2]
        reward = np.zeros((n, chunk), dtype=np.float32)
        done = np.zeros(n, bool)
        terminated, truncated, succeeded = (np.zeros(n, bool) for _ in range(3))
        executed = np.zeros(n, dtype=np.int64)
        finals: list[tuple[torch.Tensor, TensorDict]] = []  # last observations of episodes ended mid-chunk
        for c in range(chunk):
            action = actions[:, c] if self._delay is None else self._delay(actions[:, c])
            if self._perturb:
                action = self._perturb.noisy_action(action, self._state_id, self._steps)
            self._apply(action)
            self.physics.step(SUBSTEPS)
            running = ~done
            self._steps[running] += 1
            executed[running] += 1
            frame = self._frame()
            success = rewards.success(frame)
            if self.cfg.reward == "dense":
                progress = rewards.progress(frame)
                r = progress - self._progress + success
                self._progress = progress
            else:
                r = success.astype(np.float64)
            reward[running, c] = r[running]
            succeeded[running] = success[running]
            if self._watches:  # else only the named objects are placed: nothing to watch
                self._wrong_object |= running & self._moved_watched()
            terminated[running] = success[running] & self.cfg.terminate_on_success
            truncated[running] = (self._steps[running] >= self.cfg.max_episode_steps) & ~terminated[running]
            ended = np.flatnonzero(running & (terminated | truncated))
            done |= terminated | truncated
            if done.all():
                break
            if ended.size:
                finals.append((torch.from_numpy(ended), self._observe(ended)))
        obs = self._observe(np.arange(n))
        final_obs = obs.clone()
        for ended, last in finals:
            final_obs[ended] = last
        # before the resets below clear the finished episodes' flags
        flags = {WRONG_OBJECT: torch.from_numpy(self._wrong_object.copy())} if self._watches else {}
        finished = np.flatnonzero(done)
        if finished.size:
            self._reset_envs(finished, self._next_state_ids(finished))
            obs[torch.from_numpy(finished)] = self._observe(finished)
        return StepResult.build(
            obs=obs,
            reward=torch.from_numpy(reward),
            terminated=torch.from_numpy(terminated),
            truncated=torch.from_numpy(truncated),
            success=torch.from_numpy(succeeded),
            final_obs=final_obs,
            steps_executed=torch.from_numpy(executed),
            device=self.device,
            episode_flags=flags,
        )

    def _hold_action(self, env_ids: np.ndarray) -> np.ndarray:
        """[n, A] the action that keeps envs `env_ids` as they start (latency's queue before the policy's
        first action): no motion, gripper open; joint_pos: the start joints."""
        hold = np.zeros((len(env_ids), self.action_spec.dim))
        hold[:, -1] = -1.0
        if self.cfg.control_mode == "joint_pos":
            low, high = ARM_JOINT_RANGES.T
            hold[:, :7] = 2.0 * (self.physics.qpos[env_ids][:, self.idx.arm_qpos] - low) / (high - low) - 1.0
        return hold

    # ---- experts and video -------------------------------------------------------------------------
    def expert_actions(self) -> torch.Tensor:
        """The scripted expert's next action [N, A] in the env's end-effector control mode."""
        if self.cfg.control_mode == "joint_pos":
            raise UserError(
                "the tabletop scripted expert acts in end-effector space; set env.control_mode=ee_delta "
                "(or ee_delta_yaw / ee_delta_pos)"
            )
        c = self._controller
        action = self._expert.act(self._frame(), c.target_pos, c.target_rot)  # [N, 7], roll/pitch zero
        # ee_delta_pos drops the expert's turn to the cube's faces: the hand grasps a yawed cube across
        # (the 8 cm opening spans a 4.5 cm cube at the 30-degree maximum yaw).
        action = action[:, EE_MODE_DIMS[self.cfg.control_mode]]
        return torch.from_numpy(np.ascontiguousarray(action))

    def task_progress(self) -> torch.Tensor:
        """[N] the shaped potential of the dense reward (rewards.progress), whatever env.reward is."""
        return torch.from_numpy(rewards.progress(self._frame()))

    def render(self, env_ids: torch.Tensor | None = None) -> torch.Tensor:
        ids = np.arange(self.num_envs) if env_ids is None else torch.as_tensor(env_ids).flatten().numpy()
        if ((ids < 0) | (ids >= self.num_envs)).any():
            raise UserError(f"render env ids must be in [0, {self.num_envs}), got {ids.tolist()}")
        if self._video_renderer is None:
            size = max(self.cfg.image_size, 128)
            self._video_renderer = BatchRenderer(self.model, size, self.cfg.render_shadows, "front")
        return torch.from_numpy(self._video_renderer.render(self.physics, ids))

    def close(self) -> None:
        for r in [*self._renderers.values(), self._video_renderer]:
            if r is not None:
                r.close()
        self._renderers, self._video_renderer = {}, None


def make_tabletop(cfg: EnvConfig, device: str = "cpu") -> TabletopEnv:
    """Registry factory for suites tabletop-basic and tabletop-lang."""
    return TabletopEnv(cfg, device=device)
