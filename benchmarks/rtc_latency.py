"""Chunk execution under inference latency on the MuJoCo stand-in robot: open-loop, blending, the rtc
cross-fade and guided real-time chunking (Black et al. 2025), side by side.

The robot is `robot.kind=sim` on `pick`, whose float features here are the simulator's object
observation (`privileged`: cube pose, cube - hand, goal; what a perception stack would report), since
the arm's own state does not say where the cube is. The policy is a flow MLP trained on that
observation with chunk H >= 8 and 10 Euler steps (below; guidance pulls harder with more steps). Each
inference sleeps `--latency-ms` on top of its compute (an injected inference latency: the loop keeps
ticking meanwhile, unlike `robot.latency_s`, which delays every observation). Every mode executes
N = `--execute-steps` actions of each chunk; rtc and guided_rtc query `inference_delay_steps` earlier,
set to the expected delay (latency * fps, rounded up, plus the tick at which the result is polled).
The safety layer keeps its bounds but its rate limits (`max_relative_target`, `max_chunk_jump`) are
off, so that the seams are measured as the policy made them.

Per mode and latency: the action jump at chunk seams (|a_t - a_{t-1}|, L2 over the arm dims, the
gripper's deliberate switch left out; t is the first step executed from a new chunk, a_{t-1} what was
sent before, the hold action where the robot starved), the same jump between steps inside chunks,
success and episode length. Jump means are taken per episode, then over episodes, so that the long
episodes of failures do not outweigh the others; the maximum is over every seam. Below the table, guided_rtc's
seam jump minus each other mode's, paired by episode (the same initial states and noise seeds), with its
standard error: the noise to judge a difference by.

    embodrl collect pick_flow_noise --out data/rtc_pick_demos --episodes-per-task 100 \\
        env.control_mode=ee_delta policy.action_dim=7
    embodrl sft pick_flow_noise env=none sft.dataset=data/rtc_pick_demos \\
        'sft.key_map={state: observation.environment_state}' 'policy.obs_keys=[state]' \\
        'policy.value_obs_keys=[]' policy.chunk_size=8 policy.action_dim=7 policy.flow.num_steps=10 \\
        sft.steps=8000 name=rtc_pick_h8_k10
    python benchmarks/rtc_latency.py runs/rtc_pick_h8_k10/<timestamp>/checkpoints/last/policy --episodes 30
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from embodrl.deploy.chunking import ChunkExecutor
from embodrl.deploy.config import ChunkConfig, DeployConfig, RobotConfig, SafetyConfig
from embodrl.deploy.inference import LocalPolicy
from embodrl.deploy.loop import ControlLoop
from embodrl.deploy.runner import CheckpointRunner
from embodrl.deploy.sim_robot import SimRobot

MODES = ("open_loop", "blend", "rtc", "guided_rtc")


class PerceivingSimRobot(SimRobot):
    """The stand-in arm whose float features are the simulator's object observation, plus the record of
    what was sent (for the seam jumps)."""

    def __init__(self, cfg: RobotConfig) -> None:
        super().__init__(cfg)
        size = self.env.observation_spec["privileged"].shape[0]
        self.object_names = tuple(f"object.{i}" for i in range(size))
        self.sent: list[np.ndarray] = []

    @property
    def observation_features(self) -> dict[str, Any]:
        return {name: float for name in self.object_names}

    def reset_episode(self, seed: int | None = None) -> None:
        super().reset_episode(seed)
        self.sent = []

    def get_observation(self) -> dict[str, Any]:
        values = self._obs["privileged"][0].numpy()
        return dict(zip(self.object_names, map(float, values), strict=True))

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]:
        executed = super().send_action(action)
        self.sent.append(np.array([executed[name] for name in self.action_names]))
        return executed


class SeamRecorder(ChunkExecutor):
    """A ChunkExecutor that notes the steps whose action is the first of a new chunk, and each delay."""

    def reset(self) -> None:
        super().reset()
        self.seams: list[int] = []
        self.delays: list[int] = []
        self._new_chunk = False

    def add_chunk(self, chunk: np.ndarray, obs_step: int) -> None:
        self.delays.append(self.step - obs_step)
        super().add_chunk(chunk, obs_step)
        self._new_chunk = True

    def pop_action(self) -> np.ndarray | None:
        action = super().pop_action()
        if action is not None and self._new_chunk:
            self.seams.append(self.step - 1)
            self._new_chunk = False
        return action


class SlowPolicy(LocalPolicy):
    """A local policy whose every inference takes `latency_s` longer (and notes its compute time)."""

    def __init__(self, runner: CheckpointRunner, keys, latency_s: float) -> None:
        super().__init__(runner, keys)
        self.latency_s = latency_s
        self.compute_ms: list[float] = []

    def infer(self, request: dict[str, Any]) -> np.ndarray:
        start = time.monotonic()
        chunk = super().infer(request)
        self.compute_ms.append(1000 * (time.monotonic() - start))
        time.sleep(self.latency_s)
        return chunk


@dataclass
class ModeResult:
    mode: str
    latency_ms: float
    delay_steps: int
    episodes: int = 0
    successes: int = 0
    steps: list[int] = field(default_factory=list)
    seam_jumps: list[list[float]] = field(default_factory=list)  # per episode
    inner_jumps: list[list[float]] = field(default_factory=list)
    starved_steps: int = 0
    late_ticks: int = 0
    compute_ms: float = 0.0
    measured_delays: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        per_episode = [float(np.mean(jumps)) if jumps else None for jumps in self.seam_jumps]
        seams = [jump for jump in per_episode if jump is not None]
        inner = [np.mean(jumps) for jumps in self.inner_jumps if jumps]
        every_seam = [jump for jumps in self.seam_jumps for jump in jumps]
        return {
            "mode": self.mode,
            "latency_ms": self.latency_ms,
            "delay_steps": self.delay_steps,
            "seam_jump_mean": float(np.mean(seams)) if seams else math.nan,
            "seam_jump_max": float(np.max(every_seam)) if every_seam else math.nan,
            "seam_jump_per_episode": per_episode,  # None where an episode had no seam
            "inner_jump_mean": float(np.mean(inner)) if inner else math.nan,
            "seams": len(every_seam),
            "success": self.successes / max(self.episodes, 1),
            "episodes": self.episodes,
            "steps_mean": float(np.mean(self.steps)),
            "starved_steps": self.starved_steps,
            "late_ticks": self.late_ticks,
            "compute_ms": self.compute_ms,
            "measured_delay_mode": self.typical_delay(),
        }

    def typical_delay(self) -> int:
        """The most frequent measured delay in steps (-1 when no chunk came late)."""
        return int(np.bincount(self.measured_delays).argmax()) if self.measured_delays else -1


def arm_jumps(sent: list[np.ndarray], seams: list[int], gripper_dim: int) -> tuple[list[float], list[float]]:
    """L2 steps |a_t - a_{t-1}| over the arm dims, split into seam steps and the others."""
    actions = np.delete(np.asarray(sent), gripper_dim, axis=1)
    steps = np.linalg.norm(np.diff(actions, axis=0), axis=1)  # steps[t - 1] = |a_t - a_{t-1}|
    seam_set = {t for t in seams if t >= 1}
    at_seams = [float(steps[t - 1]) for t in sorted(seam_set) if t - 1 < len(steps)]
    inside = [float(s) for t, s in enumerate(steps, start=1) if t not in seam_set]
    return at_seams, inside


def run_mode(args, runner: CheckpointRunner, mode: str, latency_ms: float) -> ModeResult:
    delay = math.ceil(latency_ms / 1000 * args.fps) + 1  # + the tick at which the result is polled
    chunk = ChunkConfig(
        mode=mode,
        action_horizon=runner.action_horizon,
        execute_steps=args.execute_steps,
        inference_delay_steps=min(delay, args.execute_steps - 1),
    )
    robot_cfg = RobotConfig(kind="sim", suite="tabletop-basic", task="pick", seed=args.first_seed)
    cfg = DeployConfig(
        policy="local",
        fps=args.fps,
        max_steps=args.max_steps,
        robot=robot_cfg,
        chunk=chunk,
        safety=SafetyConfig(max_relative_target=None, max_chunk_jump=None),
    )
    robot = PerceivingSimRobot(robot_cfg)
    robot.connect()
    source = SlowPolicy(runner, cfg.keys, latency_ms / 1000)
    loop = ControlLoop(cfg, robot, source)
    loop.executor = SeamRecorder(cfg.chunk)
    result = ModeResult(mode, latency_ms, chunk.inference_delay_steps)
    gripper = cfg.safety.gripper_dim
    try:
        for episode in range(args.episodes):
            robot.reset_episode(args.first_seed + episode)
            torch.manual_seed(episode)  # the same noise draws for every mode
            stats = loop.run_episode("")
            result.episodes += 1
            result.successes += int(stats.success)
            result.steps.append(stats.steps)
            result.starved_steps += stats.starved_steps
            result.late_ticks += stats.late_ticks
            seams, inside = arm_jumps(robot.sent, loop.executor.seams, gripper)
            result.seam_jumps.append(seams)
            result.inner_jumps.append(inside)
            result.measured_delays += loop.executor.delays[1:]  # the first chunk is awaited, not late
    finally:
        loop.close()
        robot.disconnect()
    result.compute_ms = float(np.median(source.compute_ms)) if source.compute_ms else 0.0
    return result


def seam_difference(row: dict[str, Any], other: dict[str, Any]) -> tuple[float, float, int]:
    """The mean and standard error of row's per-episode seam jump minus other's, paired by episode (every
    mode plays the same initial states and noise seeds), over the episodes where both had seams."""
    pairs = [
        (a, b)
        for a, b in zip(row["seam_jump_per_episode"], other["seam_jump_per_episode"], strict=True)
        if a is not None and b is not None
    ]
    if len(pairs) < 2:
        return math.nan, math.nan, len(pairs)
    diffs = np.array([a - b for a, b in pairs])
    return float(diffs.mean()), float(diffs.std(ddof=1) / math.sqrt(len(diffs))), len(diffs)


def guided_differences(rows: list[dict[str, Any]]) -> list[str]:
    """Per latency, guided_rtc's paired seam-jump difference to every other mode, one line each."""
    lines = []
    for guided in (r for r in rows if r["mode"] == "guided_rtc"):
        for other in rows:
            if other["latency_ms"] == guided["latency_ms"] and other["mode"] != "guided_rtc":
                mean, stderr, n = seam_difference(guided, other)
                lines.append(
                    f"{guided['latency_ms']:.0f} ms: guided_rtc - {other['mode']} seam jump "
                    f"{mean:+.3f} +- {stderr:.3f} (paired standard error, {n} episodes)"
                )
    return lines


def markdown(rows: list[dict[str, Any]], fps: float) -> str:
    header = (
        "latency (delay d)",
        "mode",
        "seam jump mean",
        "seam jump max",
        "jump inside chunks",
        "success",
        "episode steps (s)",
        "starved steps",
        "late ticks",
        "inference compute (ms)",
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = (
            f"{r['latency_ms']:.0f} ms (d={r['delay_steps']})",
            r["mode"],
            f"{r['seam_jump_mean']:.3f}",
            f"{r['seam_jump_max']:.3f}",
            f"{r['inner_jump_mean']:.3f}",
            f"{100 * r['success']:.0f}% ({r['episodes']})",
            f"{r['steps_mean']:.1f} ({r['steps_mean'] / fps:.1f})",
            str(r["starved_steps"]),
            str(r["late_ticks"]),
            f"{r['compute_ms']:.1f}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "checkpoint", help="a flow policy checkpoint trained on the object observation (above)"
    )
    parser.add_argument("--episodes", type=int, default=30, help="episodes per mode and latency")
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[100.0, 200.0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--fps", type=float, default=10.0, help="control rate of the loop")
    parser.add_argument("--execute-steps", type=int, default=4, help="N: actions executed from each chunk")
    parser.add_argument("--max-steps", type=int, default=80, help="steps per episode (the task's limit)")
    parser.add_argument("--first-seed", type=int, default=0, help="initial state of the first episode")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    runner = CheckpointRunner(args.checkpoint)
    rows = []
    for latency in args.latency_ms:
        for mode in args.modes:
            row = run_mode(args, runner, mode, latency).summary()
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(markdown(rows, args.fps))
    print("\n".join(guided_differences(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
