"""What env.randomize does to one LIBERO task env (LIBERO_AXES in sims/perturbation.py): the cameras,
lights, friction and object masses of its MjModel, the initial state it resets to, the instruction level
it is shown, the state it observes and the actions it executes. The instruction texts themselves are
sims/libero/paraphrase.py's.

Every draw is a function of env.randomize.seed, the axis and the episode's initial-state id
(sims/episode_draws.py): a level scales the same draw, and the nominal initial state is the one perturbed.
"""

from __future__ import annotations

from types import SimpleNamespace

import mujoco
import numpy as np

from embodrl.sims.episode_draws import EpisodeDraws, level_of
from embodrl.sims.tabletop.perturb_model import MODEL_EDITS, ModelEdit, ModelParts, random_sign, scale_lights

OBJECT_SHIFT = 0.02  # m per unit of severity, in a random horizontal direction per object
JOINT_TURN = 0.02  # rad per unit of severity, a random sign per arm joint
LIGHT_TILT = np.deg2rad(15.0)  # per unit of severity
ARM_JOINT_PREFIX = "robot0_joint"


def edit_lighting(model, nominal, parts, rng: np.random.Generator, severity: float) -> None:
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


# the tabletop edits that apply to any MjModel, and LIBERO's lighting (its lights are spot lights)
EDITS: dict[str, ModelEdit] = {
    "camera": MODEL_EDITS["camera"],
    "lighting": edit_lighting,
    "friction": MODEL_EDITS["friction"],
    "mass": MODEL_EDITS["mass"],
}


def _nominal_fields(model: mujoco.MjModel) -> SimpleNamespace:
    """Copies of the fields the edits read (a copy of a whole LIBERO model would hold its ~200 MB of
    textures once more per env)."""
    images = ("cam_pos", "cam_quat", "light_dir", "light_diffuse")
    dynamics = ("geom_friction", "body_mass", "body_inertia")
    headlight = model.vis.headlight
    return SimpleNamespace(
        ncam=model.ncam,
        nlight=model.nlight,
        **{name: getattr(model, name).copy() for name in images + dynamics},
        vis=SimpleNamespace(
            headlight=SimpleNamespace(ambient=headlight.ambient.copy(), diffuse=headlight.diffuse.copy())
        ),
    )


def movable_bodies(model: mujoco.MjModel) -> np.ndarray:
    """The bodies of the objects that move freely (a free joint on the body or an ancestor)."""
    free = set(model.jnt_bodyid[model.jnt_type == mujoco.mjtJoint.mjJNT_FREE].tolist())

    def moves(body: int) -> bool:
        return body in free or (body != 0 and moves(int(model.body_parentid[body])))

    return np.array([b for b in range(model.nbody) if moves(b)], dtype=np.int64)


class LiberoPerturbations(EpisodeDraws):
    """env.randomize for one LIBERO task env, whose MjModel is `model` (edited in place at each reset)."""

    def __init__(self, cfg, model: mujoco.MjModel, num_tasks: int) -> None:
        super().__init__(cfg)
        self._nominal = _nominal_fields(model)
        # the mass edit scales the `cube_bodies` of a ModelParts: here every movable object's bodies
        self._parts = ModelParts(
            cube_geoms=np.zeros(0, np.int64), cube_bodies=movable_bodies(model), colour_geoms=()
        )
        self._num_tasks = num_tasks
        free = np.flatnonzero(model.jnt_type == mujoco.mjtJoint.mjJNT_FREE)
        self._object_qpos = model.jnt_qposadr[free]  # each movable object's x (y follows)
        names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) or "" for j in range(model.njnt)]
        arm = [j for j, name in enumerate(names) if name.startswith(ARM_JOINT_PREFIX)]
        self._arm_qpos = model.jnt_qposadr[arm]

    def edit_model(self, model: mujoco.MjModel, data: mujoco.MjData, state_id: int) -> None:
        """`model` as the episode from `state_id` perturbs it, from the nominal fields (an env's model is
        edited again at every reset and never drifts); `data` is scratch for the derived constants."""
        for axis in EDITS:
            if axis in self.axes:
                severity = self.severity(axis, state_id)
                EDITS[axis](model, self._nominal, self._parts, self.rng(axis, state_id), severity)
        if "mass" in self.axes:  # subtree masses and inverse weights follow the masses
            mujoco.mj_setConst(model, data)

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
