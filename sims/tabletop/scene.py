"""MJCF of the tabletop scene, generated in Python: table, Panda-like 7-DoF arm, gripper, objects.

Arm kinematics are the public Franka Panda ones (link offsets 0.333, 0.316, 0.0825, 0.384, 0.088,
0.107 m and its joint ranges); links are visual capsules, only the finger pads collide. Contact
settings follow the calibration prototype (stable grasps: friction 1.5, condim 4, elliptic cones,
impratio 10, stiff pad contacts, gravity-compensated arm).
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from embodrl.sims.tabletop.tasks import COLORS

TIMESTEP = 0.005  # s; 10 substeps make one 0.05 s control step
CUBE_HALF = 0.0225  # m
BOWL_RADIUS = 0.065  # m, inner wall radius
BUTTON_TOP = 0.03  # m, cap top height at rest
FINGER_OPEN = 0.04  # m per finger: 8 cm max gap
PARK_X = 10.0  # unused objects wait here, far out of view

ARM_JOINT_RANGES = np.array(
    [
        [-2.8973, 2.8973],
        [-1.7628, 1.7628],
        [-2.8973, 2.8973],
        [-3.0718, -0.0698],
        [-2.8973, 2.8973],
        [-0.0175, 3.7525],
        [-2.8973, 2.8973],
    ]
)
ARM_HOME = np.array([0.0, 0.2, 0.0, -2.0, 0.0, 2.2, 0.785])

_RGB = {name: " ".join(f"{c:.2f}" for c in rgb) for name, rgb in COLORS.items()}

# (body pos, body quat, capsule fromto for the link's visual) per Panda link 1..7
_LINKS = [
    ("0 0 0.333", "1 0 0 0", "0 0 -0.19 0 0 0"),
    ("0 0 0", "1 -1 0 0", "0 0 0 0 -0.12 0"),
    ("0 -0.316 0", "1 1 0 0", "0 0 -0.2 0 0 0"),
    ("0.0825 0 0", "1 1 0 0", "-0.0825 0 0 0 0.1 0"),
    ("-0.0825 0.384 0", "1 -1 0 0", "0 0 -0.26 0 0 0"),
    ("0 0 0", "1 1 0 0", "0 0 0 0.088 0 0"),
    ("0.088 0 0", "1 1 0 0", "0 0 -0.05 0 0 0.06"),
]


def _arm_xml() -> str:
    head = []
    tail = []
    for i, (pos, quat, fromto) in enumerate(_LINKS, start=1):
        lo, hi = ARM_JOINT_RANGES[i - 1]
        head.append(
            f'<body name="link{i}" pos="{pos}" quat="{quat}" gravcomp="1">'
            f'<joint name="joint{i}" range="{lo} {hi}"/>'
            f'<geom class="visual" type="capsule" size="0.05" fromto="{fromto}" rgba="0.92 0.92 0.95 1"/>'
        )
        tail.append("</body>")
    pad = 'class="pad" size="0.011 0.004 0.014"'
    hand = (
        '<body name="hand" pos="0 0 0.107" quat="0.9238795 0 0 -0.3826834" gravcomp="1">'
        '<geom class="visual" type="box" size="0.025 0.1 0.025" pos="0 0 0.03" rgba="0.9 0.9 0.92 1"/>'
        '<site name="ee" pos="0 0 0.1034" size="0.005" rgba="1 0 1 0"/>'
        '<camera name="wrist" pos="0.07 0 0.02" xyaxes="0 1 0 0.95 0 0.3" fovy="75"/>'
        '<body name="left_finger" pos="0 0 0.0584" gravcomp="1">'
        '<joint name="finger_left" type="slide" axis="0 1 0" range="0 0.04"/>'
        '<geom class="visual" type="box" size="0.009 0.006 0.025" pos="0 0.01 0.02" rgba="0.25 0.25 0.27 1"/>'
        f'<geom name="pad_left" {pad} pos="0 0.004 0.045"/>'
        "</body>"
        '<body name="right_finger" pos="0 0 0.0584" quat="0 0 0 1" gravcomp="1">'
        '<joint name="finger_right" type="slide" axis="0 1 0" range="0 0.04"/>'
        '<geom class="visual" type="box" size="0.009 0.006 0.025" pos="0 0.01 0.02" rgba="0.25 0.25 0.27 1"/>'
        f'<geom name="pad_right" {pad} pos="0 0.004 0.045"/>'
        "</body></body>"
    )
    return (
        '<body name="link0" pos="0 0 0"><geom class="visual" type="cylinder" size="0.07 0.05" pos="0 0 0.05"'
        ' rgba="0.92 0.92 0.95 1"/>' + "".join(head) + hand + "".join(tail) + "</body>"
    )


def _bowl_xml(color: str, rgb: str) -> str:
    walls = []
    for k in range(12):
        a = 2 * np.pi * k / 12
        x, y = (BOWL_RADIUS + 0.005) * np.cos(a), (BOWL_RADIUS + 0.005) * np.sin(a)
        walls.append(
            f'<geom class="bowl" type="box" size="0.005 0.019 0.02" pos="{x:.4f} {y:.4f} 0.02"'
            f' euler="0 0 {a:.4f}" rgba="{rgb} 1"/>'
        )
    return (
        f'<body name="bowl_{color}" mocap="true" pos="{PARK_X} 0 0">'
        f'<geom class="bowl" type="cylinder" size="{BOWL_RADIUS + 0.01} 0.003" pos="0 0 0.003"'
        f' rgba="{rgb} 1"/>' + "".join(walls) + "</body>"
    )


def scene_xml() -> str:
    """The whole scene as an MJCF string: arm, table, and every object in every colour (parked)."""
    objects = []
    for color, rgb in _RGB.items():
        objects.append(
            f'<body name="cube_{color}" pos="{PARK_X} 0 {CUBE_HALF}"><freejoint name="cube_{color}"/>'
            f'<geom class="object" type="box" size="{CUBE_HALF} {CUBE_HALF} {CUBE_HALF}" mass="0.08"'
            f' rgba="{rgb} 1"/></body>'
        )
        objects.append(_bowl_xml(color, rgb))
        objects.append(
            f'<body name="target_{color}" mocap="true" pos="{PARK_X} 0 0">'
            f'<geom class="visual" type="sphere" size="0.02" rgba="{rgb} 0.8"/></body>'
        )
        objects.append(
            f'<body name="plate_{color}" mocap="true" pos="{PARK_X} 0 0">'
            f'<geom class="visual" type="cylinder" size="0.05 0.001" pos="0 0 0.001" rgba="{rgb} 1"/></body>'
        )
        objects.append(
            f'<body name="button_{color}" mocap="true" pos="{PARK_X} 0 0">'
            '<geom class="object" type="box" size="0.04 0.04 0.01" pos="0 0 0.01" rgba="0.3 0.3 0.3 1"/>'
            f'<body name="button_cap_{color}" pos="0 0 0.02">'
            f'<joint name="button_{color}" type="slide" axis="0 0 1" range="-0.015 0" stiffness="40"'
            ' damping="2"/>'
            f'<geom class="object" type="cylinder" size="0.025 0.005" pos="0 0 0.005" rgba="{rgb} 1"'
            ' mass="0.02"/></body></body>'
        )
    return f"""<mujoco model="embodrl_tabletop">
  <compiler angle="radian" autolimits="true"/>
  <option timestep="{TIMESTEP}" integrator="implicitfast" cone="elliptic" impratio="10"/>
  <visual><global offwidth="640" offheight="640"/><quality shadowsize="1024"/>
    <headlight ambient="0.45 0.45 0.45" diffuse="0.5 0.5 0.5"/></visual>
  <default>
    <joint armature="0.1" damping="1"/>
    <default class="visual"><geom contype="0" conaffinity="0" group="1" density="300"/></default>
    <default class="pad"><geom type="box" contype="1" conaffinity="1" friction="1.5 0.005 0.0001"
      condim="4" solref="0.01 1" solimp="0.95 0.99 0.001" priority="1" mass="0.02"
      rgba="0.15 0.15 0.15 1"/></default>
    <default class="object"><geom contype="1" conaffinity="1" friction="0.8 0.005 0.0001"
      condim="4"/></default>
    <default class="finger"><position kp="300" kv="10" ctrlrange="0 0.04" forcerange="-15 15"/></default>
    <default class="bowl"><geom contype="1" conaffinity="1" friction="1 0.005 0.0001" condim="3"/></default>
  </default>
  <asset>
    <texture name="grid" type="2d" builtin="checker" rgb1="0.35 0.35 0.38" rgb2="0.3 0.3 0.33"
      width="64" height="64"/>
    <material name="floor" texture="grid" texrepeat="8 8"/>
  </asset>
  <worldbody>
    <light pos="0.4 0 2" dir="0 0 -1" diffuse="0.6 0.6 0.6" castshadow="true"/>
    <geom name="floor" type="plane" size="0 0 0.05" pos="0 0 -0.75" material="floor" contype="1"
      conaffinity="1"/>
    <geom name="table" type="box" size="0.6 0.7 0.375" pos="0.45 0 -0.375" rgba="0.62 0.5 0.38 1"
      contype="1" conaffinity="1"/>
    <camera name="front" pos="1.1 0 0.65" xyaxes="0 1 0 -0.618 0 0.786" fovy="52"/>
    {_arm_xml()}
    {"".join(objects)}
  </worldbody>
  <contact><exclude body1="left_finger" body2="right_finger"/></contact>
  <actuator>
    {
        "".join(
            f'<position name="act{i}" joint="joint{i}" kp="{1500 if i <= 4 else 600}"'
            f' kv="{150 if i <= 4 else 60}" ctrlrange="{lo} {hi}"/>'
            for i, (lo, hi) in enumerate(ARM_JOINT_RANGES, start=1)
        )
    }
    <position name="finger_left" joint="finger_left" class="finger"/>
    <position name="finger_right" joint="finger_right" class="finger"/>
  </actuator>
</mujoco>"""


@dataclass
class SceneIndex:
    """Addresses in qpos/mocap of everything the env reads or writes, resolved once per model."""

    arm_joint: np.ndarray  # [7] joint ids of the arm
    arm_qpos: np.ndarray  # [7] qpos addresses of the arm joints
    arm_dof: np.ndarray  # [7] dof addresses of the arm joints
    finger_qpos: np.ndarray  # [2]
    ee_site: int
    cube_qpos: np.ndarray  # [n_colors] start address of each cube's free joint (pos 3, quat 4)
    cube_dof: np.ndarray  # [n_colors]
    cube_geom: np.ndarray  # [n_colors] the box geom of each cube
    button_qpos: np.ndarray  # [n_colors]
    bowl_mocap: np.ndarray  # [n_colors] mocap ids
    target_mocap: np.ndarray
    plate_mocap: np.ndarray
    button_mocap: np.ndarray

    @classmethod
    def of(cls, model: mujoco.MjModel) -> SceneIndex:
        def jnt(name: str) -> int:
            return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)

        def mocap(prefix: str) -> np.ndarray:
            ids = [mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, f"{prefix}_{c}") for c in COLORS]
            return np.array([model.body_mocapid[b] for b in ids])

        arm = [jnt(f"joint{i}") for i in range(1, 8)]
        cubes = [jnt(f"cube_{c}") for c in COLORS]
        return cls(
            arm_joint=np.array(arm),
            arm_qpos=model.jnt_qposadr[arm].copy(),
            arm_dof=model.jnt_dofadr[arm].copy(),
            finger_qpos=model.jnt_qposadr[[jnt("finger_left"), jnt("finger_right")]].copy(),
            ee_site=mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "ee"),
            cube_qpos=model.jnt_qposadr[cubes].copy(),
            cube_dof=model.jnt_dofadr[cubes].copy(),
            cube_geom=np.array([np.flatnonzero(model.geom_bodyid == model.jnt_bodyid[j])[0] for j in cubes]),
            button_qpos=model.jnt_qposadr[[jnt(f"button_{c}") for c in COLORS]].copy(),
            bowl_mocap=mocap("bowl"),
            target_mocap=mocap("target"),
            plate_mocap=mocap("plate"),
            button_mocap=mocap("button"),
        )


def build_model() -> mujoco.MjModel:
    """Compile the tabletop scene."""
    return mujoco.MjModel.from_xml_string(scene_xml())
