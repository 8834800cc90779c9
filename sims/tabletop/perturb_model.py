"""Perturbation axes that edit an env's own MjModel: cameras, lighting, colours, cube size, mass,
friction, actuator gains.

Each edit writes its fields of `model` as a function of the nominal model, the severity and a
generator (the episode's draws), never of what `model` held before: an env's model is edited again at
every reset and never drifts. AXES in sims/perturbation.py says what one unit of severity does.
"""

from __future__ import annotations

import colorsys
from collections.abc import Callable
from dataclasses import dataclass

import mujoco
import numpy as np

from embodrl.sims.tabletop.scene import SceneIndex
from embodrl.sims.tabletop.tasks import COLORS

LIGHT_TARGET = np.array([0.4, 0.0, 0.0])  # where the tilted light still points: the middle of the table
LIGHT_DISTANCE = 2.0  # m, as in the scene


@dataclass(frozen=True)
class ModelParts:
    """The ids the edits address in a model, resolved once."""

    cube_geoms: np.ndarray  # [colors]
    cube_bodies: np.ndarray  # [colors]
    colour_geoms: tuple[np.ndarray, ...]  # per colour, every geom drawn in it

    @classmethod
    def of(cls, model: mujoco.MjModel, idx: SceneIndex) -> ModelParts:
        rgb = model.geom_rgba[:, :3]
        colour_geoms = tuple(np.flatnonzero(np.abs(rgb - c).max(-1) < 1e-6) for c in COLORS.values())
        return cls(idx.cube_geom, model.geom_bodyid[idx.cube_geom], colour_geoms)


def random_unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.normal(size=3)
    return v / np.linalg.norm(v)


def random_sign(rng: np.random.Generator) -> float:
    return 1.0 if rng.random() < 0.5 else -1.0


def _rotate_quat(quat: np.ndarray, axis: np.ndarray, angle: float) -> np.ndarray:
    turn = np.zeros(4)
    mujoco.mju_axisAngle2Quat(turn, axis, angle)
    out = np.zeros(4)
    mujoco.mju_mulQuat(out, quat, turn)
    return out


def edit_camera(model, nominal, parts, rng, severity) -> None:
    for c in range(nominal.ncam):
        model.cam_pos[c] = nominal.cam_pos[c] + 0.03 * severity * random_unit(rng)
        model.cam_quat[c] = _rotate_quat(nominal.cam_quat[c], random_unit(rng), np.deg2rad(3.0) * severity)


def scale_lights(model, nominal, scale: float) -> None:
    """Every light's and the headlight's intensity `scale` times the nominal one's (at most 1)."""
    model.light_diffuse[:] = np.clip(nominal.light_diffuse * scale, 0.0, 1.0)
    for field in ("ambient", "diffuse"):
        setattr(model.vis.headlight, field, np.clip(getattr(nominal.vis.headlight, field) * scale, 0.0, 1.0))


def edit_lighting(model, nominal, parts, rng, severity) -> None:
    scale_lights(model, nominal, 1.35 ** (random_sign(rng) * severity))
    azimuth = rng.uniform(0.0, 2 * np.pi)
    tilt = np.deg2rad(15.0) * severity
    direction = np.array([np.sin(tilt) * np.cos(azimuth), np.sin(tilt) * np.sin(azimuth), -np.cos(tilt)])
    model.light_dir[:] = direction
    model.light_pos[:] = LIGHT_TARGET - LIGHT_DISTANCE * direction


def edit_color(model, nominal, parts, rng, severity) -> None:
    for geoms in parts.colour_geoms:
        hue_turn = random_sign(rng) * severity * 12.0 / 360.0
        brightness = 1.0 + random_sign(rng) * 0.1 * severity
        h, s, v = colorsys.rgb_to_hsv(*nominal.geom_rgba[geoms[0], :3])
        rgb = colorsys.hsv_to_rgb((h + hue_turn) % 1.0, s, float(np.clip(v * brightness, 0.0, 1.0)))
        model.geom_rgba[geoms, :3] = rgb


def edit_size(model, nominal, parts, rng, severity) -> None:
    scale = 1.0 + random_sign(rng) * 0.06 * severity
    g = parts.cube_geoms
    model.geom_size[g] = nominal.geom_size[g] * scale
    model.geom_rbound[g] = nominal.geom_rbound[g] * scale
    model.geom_aabb[g] = nominal.geom_aabb[g] * scale


def edit_mass(model, nominal, parts, rng, severity) -> None:
    scale = 1.6 ** (random_sign(rng) * severity)
    b = parts.cube_bodies
    model.body_mass[b] = nominal.body_mass[b] * scale
    model.body_inertia[b] = nominal.body_inertia[b] * scale


def edit_friction(model, nominal, parts, rng, severity) -> None:
    model.geom_friction[:, 0] = nominal.geom_friction[:, 0] * 1.3 ** (random_sign(rng) * severity)


def edit_gains(model, nominal, parts, rng, severity) -> None:
    scale = 1.3 ** (random_sign(rng) * severity)
    model.actuator_gainprm[:, 0] = nominal.actuator_gainprm[:, 0] * scale  # kp
    model.actuator_biasprm[:, 1:3] = nominal.actuator_biasprm[:, 1:3] * scale  # -kp, -kv


ModelEdit = Callable[[mujoco.MjModel, mujoco.MjModel, ModelParts, np.random.Generator, float], None]
MODEL_EDITS: dict[str, ModelEdit] = {
    "camera": edit_camera,
    "lighting": edit_lighting,
    "color": edit_color,
    "size": edit_size,
    "mass": edit_mass,
    "friction": edit_friction,
    "gains": edit_gains,
}
NEEDS_SET_CONST = frozenset({"mass"})  # derived constants (subtree masses, inverse weights) follow the masses
