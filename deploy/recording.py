"""Deploy episodes as a LeRobotDataset v3: observations, requested and sent actions, interventions, timing.

`action` is what the robot really executed (what `embodrl sft` should learn from); `action.requested`
is what the policy or the human asked for (non-finite values stored as 0, flagged in
`safety.non_finite`); `intervention` marks steps where the safety layer changed the action or held
the robot; `teleop` marks steps a human drove. Success labels use LeRobot's HIL-SERL names:
`next.reward` is 1.0 on frames where the task is done (the operator marked it, or the robot reports it),
`next.done` marks an episode's last frame: what `embodrl reward train` learns a success classifier from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodrl.data.lerobot_format import DONE_KEY, REWARD_KEY
from embodrl.data.lerobot_writer import LeRobotDatasetWriter
from embodrl.deploy.robot import RobotIO

STATS_FILE = "meta/deploy_episodes.jsonl"  # per-episode loop statistics and safety counters


@dataclass
class StepRecord:
    """One control step as recorded."""

    observation: dict[str, Any]  # the robot's raw observation
    requested: np.ndarray | None  # [A], None when nothing was available (hold)
    sent: np.ndarray  # [A] returned by send_action
    intervention: bool
    teleop: bool
    loop_ms: float
    success: bool = False  # the task is done in this observation (the operator's mark)


class EpisodeRecorder:
    """Buffers steps and writes each finished episode into one dataset folder."""

    def __init__(
        self, root: str | Path, fps: float, io: RobotIO, cameras: dict[str, str], robot_type: str
    ) -> None:
        self.io, self.cameras = io, cameras  # cameras: dataset name -> robot observation feature
        a = io.action_dim
        features: dict[str, dict] = {
            "observation.state": {
                "dtype": "float32",
                "shape": [len(io.state_names)],
                "names": io.state_names,
            },
            "action": {"dtype": "float32", "shape": [a], "names": io.action_names},
            "action.requested": {"dtype": "float32", "shape": [a], "names": io.action_names},
            "intervention": {"dtype": "bool", "shape": [1]},
            "teleop": {"dtype": "bool", "shape": [1]},
            "safety.non_finite": {"dtype": "bool", "shape": [1]},
            "timing.loop_ms": {"dtype": "float32", "shape": [1]},
            REWARD_KEY: {"dtype": "float32", "shape": [1]},
            DONE_KEY: {"dtype": "bool", "shape": [1]},
        }
        for name, feature in cameras.items():
            features[f"observation.images.{name}"] = {"dtype": "video", "shape": list(io.features[feature])}
        self.writer = LeRobotDatasetWriter(root, fps=round(fps), features=features, robot_type=robot_type)
        self.root = Path(root)
        self._last: dict | None = None  # held back one step: only the next step or the save says it is last

    def add(self, step: StepRecord) -> None:
        requested = (
            np.zeros(self.io.action_dim) if step.requested is None else np.asarray(step.requested, float)
        )
        finite = bool(np.all(np.isfinite(requested)))
        frame = {
            "observation.state": [step.observation[name] for name in self.io.state_names],
            "action": step.sent,
            "action.requested": np.nan_to_num(requested, nan=0.0, posinf=0.0, neginf=0.0),
            "intervention": step.intervention,
            "teleop": step.teleop,
            "safety.non_finite": not finite,
            "timing.loop_ms": step.loop_ms,
            REWARD_KEY: float(step.success),
        }
        for name, feature in self.cameras.items():
            frame[f"observation.images.{name}"] = step.observation[feature]
        self._flush(last=False)
        self._last = frame

    def _flush(self, last: bool) -> None:
        if self._last is not None:
            self.writer.add_frame({**self._last, DONE_KEY: last})
            self._last = None

    def save_episode(self, task: str, stats: dict[str, Any]) -> None:
        """Write the buffered steps as one episode, and `stats` as a JSON line in meta/."""
        self._flush(last=True)
        index = self.writer.save_episode(task or "deploy")
        with open(self.root / STATS_FILE, "a") as f:
            f.write(json.dumps({"episode_index": index, **stats}) + "\n")

    def close(self) -> None:
        self.writer.finalize()
