"""One LIBERO env (an `OffScreenRenderEnv` for one task) with embodrl's episode rules and env.randomize's
perturbations (sims/libero/perturb.py), in numpy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embodrl.sims.libero.perturb import LiberoPerturbations
from embodrl.sims.perturbation import RandomizeConfig

STATE_DIM = 8
PLACEMENT_SEED = 0  # of the fixtures' placements, which no initial state holds (see _reset)
CAMERAS = {"rgb": "agentview", "wrist_rgb": "robot0_eye_in_hand"}


@dataclass(frozen=True)
class TaskEnvSpec:
    """Everything a worker process needs to build one env (picklable)."""

    task_id: int
    bddl_file: str
    init_states: np.ndarray  # [num_states, state_dim] flattened MuJoCo states
    image_size: int
    cameras: tuple[str, ...]  # observation keys with images: () | ("rgb",) | ("rgb", "wrist_rgb")
    max_episode_steps: int
    terminate_on_success: bool
    randomize: RandomizeConfig
    num_tasks: int  # of the suite: a perturbed instruction's task id is task + num_tasks * level


def _quat_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    """robosuite quaternion (x, y, z, w) -> axis * angle [3]."""
    w = float(np.clip(quat[3], -1.0, 1.0))
    den = np.sqrt(1.0 - w * w)
    if den < 1e-8:
        return np.zeros(3)
    return quat[:3] * 2.0 * np.arccos(w) / den


class LiberoTaskEnv:
    """One LIBERO task env: reset to an official init state, step chunks, detect success."""

    def __init__(self, spec: TaskEnvSpec):
        from libero.libero.envs import OffScreenRenderEnv

        self.spec = spec
        self.env = OffScreenRenderEnv(
            bddl_file_name=spec.bddl_file,
            camera_heights=spec.image_size,
            camera_widths=spec.image_size,
            camera_names=list(CAMERAS.values()),
            use_camera_obs=bool(spec.cameras),
            ignore_done=True,  # episode ends are ours (success, max_episode_steps)
            hard_reset=False,  # keep the model between episodes: resets take 0.6 s instead of 4.5 s
        )
        self.elapsed = 0
        self.state_id = 0
        self.obs: dict[str, np.ndarray] = {}
        active = spec.randomize.active
        self.perturb = LiberoPerturbations(spec.randomize, self._model, spec.num_tasks) if active else None

    @property
    def _model(self):
        """The env's MjModel, which the perturbations edit (a soft reset keeps it)."""
        return self.env.sim.model._model

    def _convert(self, raw: dict) -> dict[str, np.ndarray]:
        # Images rotated 180 degrees to stand upright, as in the OpenVLA / openpi LIBERO code.
        out = {
            key: np.ascontiguousarray(raw[f"{CAMERAS[key]}_image"][::-1, ::-1]) for key in self.spec.cameras
        }
        eef = [raw["robot0_eef_pos"], _quat_to_axis_angle(raw["robot0_eef_quat"]), raw["robot0_gripper_qpos"]]
        out["state"] = np.concatenate(eef).astype(np.float32)
        out["task_id"] = np.int64(self.spec.task_id)
        if self.perturb:
            out["state"] = self.perturb.episode_state(out["state"], self.state_id, self.elapsed)
            out["task_id"] = np.int64(self.perturb.shown_task(self.spec.task_id, self.state_id))
        return out

    def _reset(self) -> None:
        """LIBERO's reset places the fixtures (cabinets, stoves: bodies without joints, so no initial state
        holds them) by numpy's global generator, a few mm and degrees apart each time: seeded, one initial
        state is one scene, at every perturbation level and in every process."""
        outer = np.random.get_state()
        np.random.seed(PLACEMENT_SEED)
        try:
            self.env.reset()
        finally:
            np.random.set_state(outer)

    def reset_to(self, state_id: int) -> dict[str, np.ndarray]:
        self._reset()
        self.state_id, self.elapsed = state_id, 0
        init = self.spec.init_states[state_id]
        if self.perturb:
            self.perturb.edit_model(self._model, self.env.sim.data._data, state_id)
            init = self.perturb.edit_init_state(init, state_id)
        self.obs = self._convert(self.env.set_init_state(init))
        return self.obs

    def step(self, actions: np.ndarray, next_state_id: int) -> dict:
        """Execute a chunk [C, 7]; on an episode end, reset to `next_state_id`."""
        chunk = len(actions)
        out = dict(reward=np.zeros(chunk, np.float32), terminated=False, truncated=False, success=False)
        for c in range(chunk):
            action = (
                self.perturb.episode_action(actions[c], self.state_id, self.elapsed)
                if self.perturb
                else actions[c]
            )
            raw, _, _, _ = self.env.step(action)
            self.elapsed += 1
            out["executed"], out["success"] = c + 1, bool(self.env.check_success())
            out["reward"][c] = float(out["success"])
            out["terminated"] = out["success"] and self.spec.terminate_on_success
            out["truncated"] = not out["terminated"] and self.elapsed >= self.spec.max_episode_steps
            if out["terminated"] or out["truncated"] or c == chunk - 1:
                out["final"] = self._convert(raw)
            if out["terminated"] or out["truncated"]:
                break
        out["obs"] = self.reset_to(next_state_id) if out["terminated"] or out["truncated"] else out["final"]
        self.obs = out["obs"]
        return out

    def render(self) -> np.ndarray:
        size = self.spec.image_size
        frame = self.env.sim.render(camera_name=CAMERAS["rgb"], height=size, width=size)
        return np.ascontiguousarray(frame[::-1, ::-1])

    def close(self) -> None:
        self.env.close()
