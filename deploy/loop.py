"""`embodrl deploy`: the fixed-rate robot loop: observe -> chunk -> safety -> robot, every 1/fps s.

Per tick: read the robot; start an inference if the chunk executor wants one (one in flight at a
time, on a worker thread); if nothing is left to execute, wait for it until the tick ends; splice a
finished chunk in (after the safety layer validated it); take this step's action (a human's, if the
intervention hook returns one); filter it through the safety layer; send it; record the step. With
no action for `watchdog_hold_s` the robot holds, and at `watchdog_stop_s` the episode ends in a safe
stop. Any exception or Ctrl-C sends the hold action before the robot is disconnected.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from embodrl.deploy.chunking import ChunkExecutor
from embodrl.deploy.config import RobotLoopConfig
from embodrl.deploy.inference import BackgroundInference, ChunkSource
from embodrl.deploy.recording import EpisodeRecorder, StepRecord
from embodrl.deploy.robot import Robot, RobotIO
from embodrl.deploy.safety import SafetyLayer, Watchdog, WatchdogState
from embodrl.errors import UserError

logger = logging.getLogger(__name__)

# A human takeover: given the robot observation, an action [A] to execute instead of the policy's, or None.
Intervention = Callable[[dict[str, Any]], np.ndarray | None]
StepObserver = Callable[[StepRecord], None]  # told every step as it is recorded (a learning actor)


@dataclass
class EpisodeStats:
    """What happened in one episode (also written next to the recording)."""

    steps: int = 0
    success: bool = False
    stop_reason: str = "max_steps"  # max_steps | task_done | safe_stop
    chunks: int = 0
    inference_errors: int = 0
    starved_steps: int = 0  # steps with no policy action (the hold action was sent)
    late_ticks: int = 0  # ticks that overran 1/fps
    teleop_steps: int = 0
    loop_ms_p50: float = 0.0
    safety: dict[str, int] = field(default_factory=dict)

    @property
    def intervention_rate(self) -> float:
        """The share of the episode's steps a human (teleop) drove."""
        return self.teleop_steps / max(self.steps, 1)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ControlLoop:
    """Drives one connected robot with a chunk source under the safety layer."""

    def __init__(
        self,
        cfg: RobotLoopConfig,
        robot: Robot,
        source: ChunkSource,
        recorder_root: str = "",
        intervention: Intervention | None = None,
        on_step: StepObserver | None = None,
        stop_when_done: bool = False,
    ) -> None:
        """`on_step` sees every step's record; `stop_when_done` ends an episode once the task is done (the
        robot's success or the operator's mark), as a learning episode ends on success."""
        self.cfg, self.robot, self.source, self.intervention = cfg, robot, source, intervention
        self.on_step, self.stop_when_done = on_step, stop_when_done
        self.io = RobotIO(
            robot,
            cfg.keys,
            cfg.robot.camera,
            cfg.robot.wrist_camera,
            cfg.safety.ee_position_features if cfg.safety.workspace_low is not None else (),
        )
        check_compatible(cfg, source, self.io.action_dim)
        self.period = 1.0 / cfg.fps
        self.executor = ChunkExecutor(cfg.chunk)
        self.safety = SafetyLayer(cfg.safety, self.io.action_dim, cfg.fps)
        self.inference = BackgroundInference(source)
        self.recorder: EpisodeRecorder | None = None
        if recorder_root:
            cameras = {k: v for k, v in (("main", cfg.robot.camera), ("wrist", cfg.robot.wrist_camera)) if v}
            self.recorder = EpisodeRecorder(recorder_root, cfg.fps, self.io, cameras, cfg.robot.kind)

    def run_episode(self, prompt: str) -> EpisodeStats:
        """One episode until max_steps, the robot reports `done`, or a safe stop."""
        stats, loop_ms = EpisodeStats(), []
        counters_before = self.safety.counters.as_dict()
        errors_before = self.inference.errors
        self.executor.reset()
        self.safety.reset(self.io.present_action(self.robot.get_observation()))
        self.inference.discard()
        watchdog = Watchdog(self.cfg.safety.watchdog_hold_s, self.cfg.safety.watchdog_stop_s)
        if hasattr(self.intervention, "success_marked"):  # a new episode starts not done
            self.intervention.success_marked = False
        self._deadline = time.monotonic() + self.period
        try:
            for _ in range(self.cfg.max_steps):
                start = time.monotonic()
                observation = self.robot.get_observation()
                done_now = self._task_done()  # the label of this observation, before the action
                request = self.io.request(observation, prompt)
                requested, teleop = self._next_action(observation, request, stats)
                if requested is None:
                    state = watchdog.check(time.monotonic())
                    stats.starved_steps += 1
                    if state is WatchdogState.HOLD:
                        self.safety.counters.watchdog_holds += 1
                    elif state is WatchdogState.STOP:
                        self._safe_stop(stats, "watchdog: no fresh action within safety.watchdog_stop_s")
                        break
                else:
                    watchdog.feed(time.monotonic())
                sent = self.safety.filter(requested, self.io.ee_position(observation))
                intervened = requested is None or not np.allclose(sent, requested, atol=1e-9, equal_nan=False)
                actual = self.io.action_vector(self.robot.send_action(self.io.action_dict(sent)))
                stats.steps += 1
                loop_ms.append(1000 * (time.monotonic() - start))
                record = StepRecord(observation, requested, actual, intervened, teleop, loop_ms[-1], done_now)
                if self.recorder is not None:
                    self.recorder.add(record)
                if self.on_step is not None:
                    self.on_step(record)
                if getattr(self.robot, "done", False) or (self.stop_when_done and self._task_done()):
                    stats.stop_reason = "task_done"
                    break
                self._deadline = self._sleep_until(self._deadline, stats) + self.period
        except BaseException:  # Ctrl-C and every error: hold first, then let it propagate
            self._safe_stop(stats, "exception")
            raise
        stats.success = self._task_done()
        stats.inference_errors = self.inference.errors - errors_before
        stats.loop_ms_p50 = float(np.median(loop_ms)) if loop_ms else 0.0
        now = self.safety.counters.as_dict()
        stats.safety = {key: now[key] - counters_before[key] for key in now}
        if self.recorder is not None and stats.steps:
            self.recorder.save_episode(prompt, stats.as_dict())
        return stats

    def _next_action(
        self, observation: dict[str, Any], request: dict[str, Any], stats: EpisodeStats
    ) -> tuple[np.ndarray | None, bool]:
        """This step's requested action (policy or human) and whether a human gave it."""
        if self.executor.wants_chunk() and not self.inference.busy:
            self.inference.submit({**request, **self.executor.request_fields()}, self.executor.step)
        if self.executor.remaining == 0:  # nothing to execute: the rest of the tick may as well wait
            self.inference.wait(self._tick_left())
        finished = self.inference.poll()
        if finished is not None and self.safety.check_chunk(finished[0]):
            self.executor.add_chunk(finished[0], obs_step=finished[1])
            stats.chunks += 1
        action = self.executor.pop_action()
        human = self.intervention(observation) if self.intervention is not None else None
        if human is not None:
            stats.teleop_steps += 1
            return np.asarray(human, dtype=np.float64), True
        return action, False

    def _task_done(self) -> bool:
        """The robot's own success report (the sim stand-in has one) or the operator's mark (teleop key y)."""
        marked = bool(getattr(self.intervention, "success_marked", False))
        return bool(getattr(self.robot, "success", False)) or marked

    def _tick_left(self) -> float:
        return max(0.0, self._deadline - time.monotonic())

    def _sleep_until(self, deadline: float, stats: EpisodeStats) -> float:
        now = time.monotonic()
        if now > deadline:
            stats.late_ticks += 1
            return now  # do not try to catch up with a burst of steps
        time.sleep(deadline - now)
        return deadline

    def _safe_stop(self, stats: EpisodeStats, reason: str) -> None:
        """Send the hold action (best effort: the robot may be what failed)."""
        stats.stop_reason = "safe_stop"
        self.safety.counters.safe_stops += 1
        logger.warning("safe stop: %s", reason)
        try:
            self.robot.send_action(self.io.action_dict(self.safety.filter(None)))
        except Exception as error:  # already stopping: report, do not mask the original problem
            logger.error("could not send the hold action during a safe stop: %s", error)

    def close(self) -> None:
        self.inference.close()
        if self.recorder is not None:
            self.recorder.close()


CAMERA_SETTINGS = {"rgb": "robot.camera", "wrist_rgb": "robot.wrist_camera"}  # policy input -> robot setting


def check_compatible(cfg: RobotLoopConfig, source: ChunkSource, robot_action_dim: int) -> None:
    """Refuse to run a policy whose chunk or action size differs from the deploy config / robot.

    A size of 0 is unknown (an openpi server that does not report it): the first chunk is checked instead.
    A camera the policy reads must be named by its robot setting (else every request would lack it).
    """
    if source.action_horizon and source.action_horizon != cfg.chunk.action_horizon:
        raise UserError(
            f"the policy predicts chunks of {source.action_horizon} actions but chunk.action_horizon="
            f"{cfg.chunk.action_horizon}: a deploy horizon different from training makes consecutive chunks "
            f"jump; set chunk.action_horizon={source.action_horizon} (and chunk.execute_steps <= it)"
        )
    if source.action_dim and source.action_dim != robot_action_dim:
        raise UserError(
            f"the policy outputs {source.action_dim}-D actions but the robot takes {robot_action_dim} "
            "(its action_features); deploy a policy trained for this robot's action space"
        )
    if cfg.chunk.mode == "guided_rtc" and not getattr(source, "guided_chunks", False):
        raise UserError(
            "chunk.mode=guided_rtc needs a policy that can be guided toward the previous chunk (a flow "
            "policy served by embodrl); this one cannot: use chunk.mode=rtc"
        )
    inputs = getattr(source, "input_names", ())
    unset = [
        f"{setting} (the policy reads {key})"
        for key, setting in CAMERA_SETTINGS.items()
        if key in inputs and not getattr(cfg.robot, setting.split(".")[1])
    ]
    if unset:
        raise UserError(
            f"set {' and '.join(unset)}: the robot's camera feature that feeds it (robot.kind=sim: rgb, "
            "wrist_rgb; a LeRobot robot: its camera's name)"
        )
