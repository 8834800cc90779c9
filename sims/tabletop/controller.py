"""End-effector delta control: batched damped-least-squares IK on the 7 arm joints.

Each control step moves a per-env target pose by the action, then takes one DLS step
dq = J^T (J J^T + lambda^2 I)^-1 e on the 6-D pose error (plus a null-space pull toward the home
posture so the redundant joint does not drift) and sends q + dq to the position actuators.
"""

from __future__ import annotations

import numpy as np

POS_SCALE = 0.02  # m per control step at action 1 (0.4 m/s)
ROT_SCALE = 0.1  # rad per control step at action 1
MAX_LEAD = 0.05  # m: the target never runs further than this ahead of the hand (no wind-up)
DAMPING = 0.05  # lambda of the DLS solve
NULLSPACE_GAIN = 0.1
WORKSPACE_LOW = np.array([0.2, -0.45, 0.0])
WORKSPACE_HIGH = np.array([0.8, 0.45, 0.55])
R_DOWN = np.diag([1.0, -1.0, -1.0])  # gripper pointing down, fingers closing along world y


def euler_to_matrix(rpy: np.ndarray) -> np.ndarray:
    """[N, 3] roll/pitch/yaw (extrinsic x-y-z) -> [N, 3, 3]."""
    cr, cp, cy = np.cos(rpy).T
    sr, sp, sy = np.sin(rpy).T
    return np.stack(
        [
            np.stack([cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr], -1),
            np.stack([sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr], -1),
            np.stack([-sp, cp * sr, cp * cr], -1),
        ],
        -2,
    )


def rotation_error(target: np.ndarray, current: np.ndarray) -> np.ndarray:
    """[N, 3] rotation vector (small-angle) taking `current` to `target`, both [N, 3, 3] world frames."""
    r = target @ current.transpose(0, 2, 1)
    return 0.5 * np.stack([r[:, 2, 1] - r[:, 1, 2], r[:, 0, 2] - r[:, 2, 0], r[:, 1, 0] - r[:, 0, 1]], -1)


def hinge_jacobian(anchor: np.ndarray, axis: np.ndarray, point: np.ndarray) -> np.ndarray:
    """[N, 6, J] jacobian of a point moved by a chain of hinges: anchors, axes [N, J, 3], point [N, 3].

    Column j is (axis_j x (point - anchor_j), axis_j), what mj_jacSite gives for hinge joints, but
    from the kinematics the physics step already computed (no extra MuJoCo call per env).
    """
    linear = np.cross(axis, point[:, None, :] - anchor)
    return np.concatenate([linear, axis], -1).transpose(0, 2, 1)


def dls_step(
    jac: np.ndarray,
    error: np.ndarray,
    q: np.ndarray,
    q_home: np.ndarray,
    damping: float = DAMPING,
    nullspace_gain: float = NULLSPACE_GAIN,
) -> np.ndarray:
    """Joint update [N, 7] for pose errors [N, 6] with jacobians [N, 6, 7]."""
    jt = jac.transpose(0, 2, 1)
    jjt = jac @ jt + damping**2 * np.eye(6)
    pinv = jt @ np.linalg.inv(jjt)  # [N, 7, 6] damped pseudo-inverse
    dq = (pinv @ error[..., None])[..., 0]
    null = np.eye(jac.shape[-1]) - pinv @ jac
    return dq + nullspace_gain * (null @ (q_home - q)[..., None])[..., 0]


class EEDeltaController:
    """Holds each env's target pose and turns 7-D actions into arm joint targets and finger targets."""

    def __init__(self, num_envs: int, joint_low: np.ndarray, joint_high: np.ndarray, q_home: np.ndarray):
        self.target_pos = np.zeros((num_envs, 3))
        self.target_rot = np.tile(R_DOWN, (num_envs, 1, 1))
        self.joint_low, self.joint_high, self.q_home = joint_low, joint_high, q_home

    def reset(self, ids: np.ndarray, ee_pos: np.ndarray, ee_rot: np.ndarray) -> None:
        """Targets of envs `ids` start at the hand's pose [n, 3], [n, 3, 3]."""
        self.target_pos[ids] = ee_pos
        self.target_rot[ids] = ee_rot

    def joint_targets(
        self, action: np.ndarray, q: np.ndarray, ee_pos: np.ndarray, ee_rot: np.ndarray, jac: np.ndarray
    ) -> np.ndarray:
        """Actions [N, 7] in [-1, 1] -> arm joint position targets [N, 7]."""
        pos = np.clip(self.target_pos + POS_SCALE * action[:, :3], WORKSPACE_LOW, WORKSPACE_HIGH)
        lead = pos - ee_pos
        norm = np.linalg.norm(lead, axis=-1, keepdims=True)
        self.target_pos = ee_pos + lead * np.minimum(1.0, MAX_LEAD / np.maximum(norm, 1e-9))
        self.target_rot = euler_to_matrix(ROT_SCALE * action[:, 3:6]) @ self.target_rot
        error = np.concatenate([self.target_pos - ee_pos, rotation_error(self.target_rot, ee_rot)], -1)
        return np.clip(q + dls_step(jac, error, q, self.q_home), self.joint_low, self.joint_high)
