"""The safety layer between the policy and the robot: chunk checks, per-step clamps, the watchdog.

Per step, in this order: missing or non-finite -> the hold action (sent as is, never rate-limited);
bounds and gripper limits; rate limits (per-step delta `max_relative_target`, velocity,
acceleration; gripper exempt); end-effector workspace box; bounds again (a workspace fix of a delta
action must stay a valid action). Clipping into an interval that holds the previous action never
moves further from it, so the rate limit survives the box and bounds in absolute mode. Every change
is counted in `SafetyCounters`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from enum import Enum

import numpy as np

from embodrl.deploy.config import SafetyConfig
from embodrl.errors import ConfigError, UserError

logger = logging.getLogger(__name__)
TOLERANCE = 1e-9  # a clamp that moves an action less than this is not counted


@dataclass
class SafetyCounters:
    """How often each guard intervened (recorded with every episode)."""

    non_finite_actions: int = 0
    bounds_clamps: int = 0
    gripper_clamps: int = 0
    rate_clamps: int = 0
    workspace_clamps: int = 0
    rejected_chunks: int = 0  # NaN/inf, wrong shape, or a jump from the last sent action
    watchdog_holds: int = 0
    safe_stops: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class WatchdogState(Enum):
    OK = "ok"
    HOLD = "hold"  # no fresh action for watchdog_hold_s: keep the robot where it is
    STOP = "stop"  # ... for watchdog_stop_s: safe stop, end the episode


def _per_dim(values: tuple[float, ...] | None, dim: int, name: str) -> np.ndarray | None:
    if values is None:
        return None
    if len(values) not in (1, dim):
        raise ConfigError(f"safety.{name} has {len(values)} values; give 1 or one per action dim ({dim})")
    return np.broadcast_to(np.asarray(values, dtype=np.float64), (dim,)).copy()


class SafetyLayer:
    """Validates chunks and filters every action before it reaches the robot."""

    def __init__(self, cfg: SafetyConfig, action_dim: int, fps: float) -> None:
        self.cfg, self.action_dim, self.dt = cfg, action_dim, 1.0 / fps
        self.counters = SafetyCounters()
        self.low = _per_dim(cfg.action_low, action_dim, "action_low")
        self.high = _per_dim(cfg.action_high, action_dim, "action_high")
        if np.any(self.low > self.high):
            raise ConfigError("safety.action_low must be <= safety.action_high in every dim")
        self.gripper = None if cfg.gripper_dim is None else cfg.gripper_dim % action_dim
        self.rate_dims = np.ones(action_dim, dtype=bool)
        if self.gripper is not None:
            self.rate_dims[self.gripper] = False
        step_limits = [_per_dim(cfg.max_relative_target, action_dim, "max_relative_target")]
        velocity = _per_dim(cfg.max_velocity, action_dim, "max_velocity")
        if velocity is not None:
            step_limits.append(velocity * self.dt)
        present = [limit for limit in step_limits if limit is not None]
        self.max_step = np.minimum.reduce(present) if present else None  # [A] per-step |delta|
        acceleration = _per_dim(cfg.max_acceleration, action_dim, "max_acceleration")
        self.max_step_change = None if acceleration is None else acceleration * self.dt**2  # [A]
        self.box = None
        if cfg.workspace_low is not None:
            self.box = (np.asarray(cfg.workspace_low, float), np.asarray(cfg.workspace_high, float))
            if max(cfg.ee_dims) >= action_dim:
                raise ConfigError(f"safety.ee_dims={cfg.ee_dims} do not fit an action of {action_dim} dims")
        self.last = np.zeros(action_dim)  # the last sent action; reset() sets it per episode
        self.last_delta = np.zeros(action_dim)

    def reset(self, present: np.ndarray | None = None) -> None:
        """Start an episode from the robot's `present` position in action space [A] (NaN: unobserved).

        Absolute targets need it (rate limits and holding start from it, so the first command cannot
        jump; only the gripper may be unobserved, it then starts at 0).
        """
        self.last_delta = np.zeros(self.action_dim)
        if self.cfg.action_type == "delta":  # holding = no motion; the gripper keeps its observed command
            self.last = np.zeros(self.action_dim)
            if present is not None and self.gripper is not None and np.isfinite(present[self.gripper]):
                self.last[self.gripper] = present[self.gripper]
            return
        if present is None:
            raise ConfigError("safety.action_type=absolute needs the robot's present position at reset")
        self.last = np.asarray(present, dtype=np.float64).copy()
        unobserved = np.flatnonzero(~np.isfinite(self.last))
        if any(i != self.gripper for i in unobserved):
            raise UserError(
                f"safety.action_type=absolute: the robot does not report its present position for action "
                f"dims {unobserved.tolist()} (observation features named like its action features); "
                "without it the first command could jump"
            )
        self.last[unobserved] = 0.0

    def hold_action(self) -> np.ndarray:
        """Keep still: zero deltas (gripper unchanged) or the last absolute target."""
        if self.cfg.action_type == "absolute":
            return self.last.copy()
        hold = np.zeros(self.action_dim)
        if self.gripper is not None:
            hold[self.gripper] = self.last[self.gripper]
        return hold

    def check_chunk(self, chunk: np.ndarray) -> bool:
        """True if a chunk [H, A] may be executed; a rejected chunk is counted and must be dropped."""
        chunk = np.asarray(chunk)
        reason = ""
        if not (chunk.ndim == 2 and chunk.shape[1] == self.action_dim and chunk.shape[0] > 0):
            reason = f"shape {list(chunk.shape)}, expected [H, {self.action_dim}]"
        elif chunk.dtype.kind != "f" or not np.all(np.isfinite(chunk)):
            reason = "NaN, inf or non-float actions"
        elif self.cfg.max_chunk_jump is not None:
            jump = np.abs(chunk[0] - self.last)[self.rate_dims]
            if np.any(jump > self.cfg.max_chunk_jump):
                reason = (
                    f"its first action jumps {jump.max():.3g} from the last sent one (safety.max_chunk_jump="
                    f"{self.cfg.max_chunk_jump}; a robot in other units, e.g. joint degrees, needs its own "
                    "safety.* limits and safety.action_type=absolute)"
                )
        if reason:
            self.counters.rejected_chunks += 1
            if self.counters.rejected_chunks == 1:  # once per layer: the counters report the rest
                logger.warning("chunk rejected: %s", reason)
        return not reason

    def filter(self, action: np.ndarray | None, ee_position: np.ndarray | None = None) -> np.ndarray:
        """The action to send [A] float64; `None` or non-finite input becomes the hold action."""
        if action is None or np.shape(action) != (self.action_dim,) or not np.all(np.isfinite(action)):
            if action is not None:
                self.counters.non_finite_actions += 1
            # holding is always allowed at once (no rate limit): zero motion, or the last checked target
            self.last, self.last_delta = self.hold_action(), np.zeros(self.action_dim)
            return self.last.copy()
        out = np.asarray(action, dtype=np.float64).copy()
        out = self._clip(out, self.low, self.high, "bounds_clamps")
        if self.gripper is not None:
            g = self.gripper
            clipped = min(max(out[g], self.cfg.gripper_low), self.cfg.gripper_high)
            if abs(clipped - out[g]) > TOLERANCE:
                self.counters.gripper_clamps += 1
                out[g] = clipped
        out = self._rate_limit(out)
        out = self._workspace(out, ee_position)
        out = self._clip(out, self.low, self.high, "bounds_clamps")
        self.last_delta = np.where(self.rate_dims, out - self.last, 0.0)
        self.last = out
        return out.copy()

    def _clip(self, action: np.ndarray, low: np.ndarray, high: np.ndarray, counter: str) -> np.ndarray:
        clipped = np.clip(action, low, high)
        if np.any(np.abs(clipped - action) > TOLERANCE):
            setattr(self.counters, counter, getattr(self.counters, counter) + 1)
        return clipped

    def _rate_limit(self, action: np.ndarray) -> np.ndarray:
        delta = action - self.last
        limited = delta.copy()
        if self.max_step_change is not None:
            limited = np.clip(
                limited, self.last_delta - self.max_step_change, self.last_delta + self.max_step_change
            )
        if self.max_step is not None:
            limited = np.clip(limited, -self.max_step, self.max_step)
        limited = np.where(self.rate_dims, limited, delta)
        if np.any(np.abs(limited - delta) > TOLERANCE):
            self.counters.rate_clamps += 1
        return self.last + limited

    def _workspace(self, action: np.ndarray, ee_position: np.ndarray | None) -> np.ndarray:
        if self.box is None:
            return action
        dims = list(self.cfg.ee_dims)
        if self.cfg.action_type == "absolute":
            target = action[dims]
        elif ee_position is None:
            raise ConfigError("safety.workspace_low/high with delta actions needs the robot's EE position")
        else:
            target = np.asarray(ee_position, float) + action[dims] * self.cfg.ee_delta_scale
        clipped = np.clip(target, *self.box)
        if np.any(np.abs(clipped - target) > TOLERANCE):
            self.counters.workspace_clamps += 1
            action = action.copy()
            if self.cfg.action_type == "absolute":
                action[dims] = clipped
            else:
                action[dims] = (clipped - ee_position) / self.cfg.ee_delta_scale
        return action


class Watchdog:
    """Time since the last fresh policy action -> OK, HOLD, then STOP (times from a monotonic clock)."""

    def __init__(self, hold_s: float, stop_s: float) -> None:
        self.hold_s, self.stop_s = hold_s, stop_s
        self.last_fresh: float | None = None

    def feed(self, now: float) -> None:
        """A fresh action was sent at `now`."""
        self.last_fresh = now

    def check(self, now: float) -> WatchdogState:
        if self.last_fresh is None:
            self.last_fresh = now  # the clock starts with the first check
        waited = now - self.last_fresh
        if waited >= self.stop_s:
            return WatchdogState.STOP
        return WatchdogState.HOLD if waited >= self.hold_s else WatchdogState.OK
