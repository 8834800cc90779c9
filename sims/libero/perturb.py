"""What env.randomize does to one LIBERO task env (LIBERO_AXES in sims/perturbation.py): the cameras and
lights of its MjModel, the initial state it resets to, the instruction level it is shown, the state it
observes and the actions it executes. The instruction texts themselves are sims/libero/paraphrase.py's.

Every draw is a function of env.randomize.seed, the axis and the episode's initial-state id
(sims/episode_draws.py): a level scales the same draw, and the nominal initial state is the one perturbed.
"""

from __future__ import annotations

from types import SimpleNamespace

import mujoco
import numpy as np

from embodrl.sims.episode_draws import EpisodeDraws, level_of
from embodrl.sims.tabletop.perturb_model import edit_camera, random_sign, scale_lights

OBJECT_SHIFT = 0.02  # m per unit of severity, in a random horizontal direction per object
JOINT_TURN = 0.02  # rad per unit of severity, a random sign per arm joint
LIGHT_TILT = np.deg2rad(15.0)  # per unit of severity
ARM_JOINT_PREFIX = "robot0_joint"


def edit_lighting(model: mujoco.MjModel, nominal: mujoco.MjModel, rng: np.random.Generator, severity: float):
    """Intensity x/÷ 1.35 per unit, and every light's direction tilted 15 degrees per unit toward one random
    horizontal direction (LIBERO's lights are spot lights at fixed places: the lit spot moves)."""
    scale_lights(model, nominal, 1.35 ** (random_sign(rng) * severity))
    azimuth = rng.uniform(0.0, 2 * np.pi)
    toward = np.array([np.cos(azimuth), np.sin(azimuth), 0.0])
    turn = np.zeros(4)
    for light in range(nominal.nlight):
        axis = np.cross(nominal.light_dir[light], toward)  # perpendicular to the light: it turns by the angle
        mujoco.mju_axisAngle2Quat(turn, axis / np.linalg.norm(axis), LIGHT_TILT * severity)
        mujoco.mju_rotVecQuat(model.light_dir[light], nominal.light_dir[light], turn)


def _nominal_fields(model: mujoco.MjModel) -> SimpleNamespace:
    """Copies of the fields the camera and lighting edits read (a copy of a whole LIBERO model would hold
    its ~200 MB of textures once more per env)."""
    headlight = model.vis.headlight
    return SimpleNamespace(
        ncam=model.ncam,
        cam_pos=model.cam_pos.copy(),
        cam_quat=model.cam_quat.copy(),
        nlight=model.nlight,
        light_dir=model.light_dir.copy(),
        light_diffuse=model.light_diffuse.copy(),
        vis=SimpleNamespace(
            headlight=SimpleNamespace(ambient=headlight.ambient.copy(), diffuse=headlight.diffuse.copy())
        ),
    )


class LiberoPerturbations(EpisodeDraws):
    """env.randomize for one LIBERO task env, whose MjModel is `model` (edited in place at each reset)."""

    def __init__(self, cfg, model: mujoco.MjModel, num_tasks: int) -> None:
        super().__init__(cfg)
        self._nominal = _nominal_fields(model)
        self._num_tasks = num_tasks
        free = np.flatnonzero(model.jnt_type == mujoco.mjtJoint.mjJNT_FREE)
        self._object_qpos = model.jnt_qposadr[free]  # each movable object's x (y follows)
        names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) or "" for j in range(model.njnt)]
        arm = [j for j, name in enumerate(names) if name.startswith(ARM_JOINT_PREFIX)]
        self._arm_qpos = model.jnt_qposadr[arm]

    def edit_model(self, model: mujoco.MjModel, state_id: int) -> None:
        """`model`'s cameras and lights as the episode from `state_id` perturbs them (from the nominal ones:
        an env's model is edited again at every reset and never drifts)."""
        if "camera" in self.axes:
            edit_camera(
                model, self._nominal, None, self.rng("camera", state_id), self.severity("camera", state_id)
            )
        if "lighting" in self.axes:
            edit_lighting(
                model, self._nominal, self.rng("lighting", state_id), self.severity("lighting", state_id)
            )

    def edit_init_state(self, flat: np.ndarray, state_id: int) -> np.ndarray:
        """A flattened MuJoCo state [time, qpos, qvel] with the movable objects moved and the arm turned."""
        if "spawn" not in self.axes:
            return flat
        rng, size = self.rng("spawn", state_id), self.severity("spawn", state_id)
        out = flat.copy()
        angles = rng.uniform(0.0, 2 * np.pi, size=len(self._object_qpos))
        for adr, angle in zip(self._object_qpos, angles, strict=True):
            out[1 + adr : 3 + adr] += OBJECT_SHIFT * size * np.array([np.cos(angle), np.sin(angle)])
        signs = np.where(rng.random(len(self._arm_qpos)) < 0.5, -1.0, 1.0)
        out[1 + self._arm_qpos] += JOINT_TURN * size * signs
        return out

    def shown_task(self, task_id: int, state_id: int) -> int:
        """The obs task id, an index into the env's instruction table: task + num_tasks * text level."""
        if "instruction" not in self.axes:
            return task_id
        return task_id + self._num_tasks * level_of(self.severity("instruction", state_id))

    def episode_state(self, state: np.ndarray, state_id: int, step: int) -> np.ndarray:
        """The observed `state` [D] at `step` of the episode from `state_id` (proprioceptive noise)."""
        return self.noisy_state(state[None], np.array([state_id]), np.array([step]))[0].astype(state.dtype)

    def episode_action(self, action: np.ndarray, state_id: int, step: int) -> np.ndarray:
        """The executed `action` [A] at `step` of the episode from `state_id` (actuation noise)."""
        return self.noisy_action(action[None], np.array([state_id]), np.array([step]))[0]
