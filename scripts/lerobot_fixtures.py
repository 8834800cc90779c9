"""Write the LeRobot-made test datasets of tests/fixtures/lerobot/ with LeRobot's own recording API.

The fixtures prove that embodrl reads what LeRobot itself writes, so they are produced by LeRobot 0.4.4
(LeRobotDataset.create / add_frame / save_episode / finalize), not by embodrl's writer. LeRobot pins a
Python and torch that embodrl's environment does not hold: run this in a separate environment with
`pip install lerobot==0.4.4`, from the repository root:

    python scripts/lerobot_fixtures.py                # rewrites tests/fixtures/lerobot/*
    python scripts/lerobot_fixtures.py --out /tmp/fx  # somewhere else

(*.mp4 is git-ignored: commit regenerated videos with `git add -f`.)

Two datasets, a few hundred KB together:
  so100_video     an SO-100-style arm: 6-D joint state and action under LeRobot's SO-100 motor names, cameras
                  `observation.images.front` (64x64) and `observation.images.wrist` (48x64) stored as AV1
                  video (LeRobot's default codec), 4 episodes of 24 frames at 15 fps, two tasks.
  images_parquet  8-D state, 7-D action, one camera `observation.images.top` (48x48) stored as PNG images
                  inside the parquet files (use_videos=False), 3 episodes of 20 frames at 10 fps, two tasks.

The data is learnable: a coloured blob moves on a smooth path in the front/top image; each step the arm moves
a fixed fraction of the way towards joint targets that are a fixed function of the blob's position and of
the task, and the next state is the action. A policy that sees the image and the task can fit the actions.
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SO100_MOTORS = (
    "shoulder_pan.pos",
    "shoulder_lift.pos",
    "elbow_flex.pos",
    "wrist_flex.pos",
    "wrist_roll.pos",
    "gripper.pos",
)
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "lerobot"
GAIN = 0.5  # fraction of the way to the target moved per step


@dataclass(frozen=True)
class Spec:
    """One fixture dataset."""

    name: str
    robot_type: str
    fps: int
    episodes: int
    frames: int
    tasks: tuple[str, ...]
    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    cameras: dict[str, tuple[int, int]]  # key -> (height, width); the first one shows the blob
    use_videos: bool


SPECS = (
    Spec(
        name="so100_video",
        robot_type="so100_follower",
        fps=15,
        episodes=4,
        frames=24,
        tasks=("pick up the red block", "push the red block to the left"),
        state_names=SO100_MOTORS,
        action_names=SO100_MOTORS,
        cameras={"observation.images.front": (64, 64), "observation.images.wrist": (48, 64)},
        use_videos=True,
    ),
    Spec(
        name="images_parquet",
        robot_type="franka_like",
        fps=10,
        episodes=3,
        frames=20,
        tasks=("reach the green marker", "lift the green marker"),
        state_names=(*(f"joint_{i}.pos" for i in range(7)), "gripper.pos"),
        action_names=("x", "y", "z", "roll", "pitch", "yaw", "gripper"),
        cameras={"observation.images.top": (48, 48)},
        use_videos=False,
    ),
)


def features(spec: Spec) -> dict:
    """LeRobot feature declarations: float32 vectors with motor names, uint8 HWC cameras."""
    out = {
        "observation.state": {
            "dtype": "float32",
            "shape": (len(spec.state_names),),
            "names": list(spec.state_names),
        },
        "action": {"dtype": "float32", "shape": (len(spec.action_names),), "names": list(spec.action_names)},
    }
    for key, (h, w) in spec.cameras.items():
        out[key] = {
            "dtype": "video" if spec.use_videos else "image",
            "shape": (h, w, 3),
            "names": ["height", "width", "channels"],
        }
    return out


def blob_path(episode: int, frames: int, rng: np.random.Generator) -> np.ndarray:
    """Blob centre [frames, 2] (fractions of width, height): an arc across the image, one per episode."""
    start = rng.uniform(0.2, 0.4, size=2)
    start = np.where(rng.random(2) < 0.5, start, 1.0 - start)
    end = 1.0 - start + rng.normal(scale=0.05, size=2)  # to the opposite side: the blob always travels
    t = np.linspace(0.0, 1.0, frames)[:, None]
    bend = 0.1 * np.sin(np.pi * t) * (1 if episode % 2 else -1)
    return np.clip(start + (end - start) * t + bend, 0.15, 0.85)


def draw(height: int, width: int, centre: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    """A grey image uint8 [H, W, 3] with a filled disc at `centre` (fractions of width, height)."""
    yy, xx = np.mgrid[0:height, 0:width]
    image = np.full((height, width, 3), 96, dtype=np.uint8)
    image[:, :, 2] = 128  # a blue-ish background, so no channel is constant
    radius = 0.12 * min(height, width)
    inside = (xx - centre[0] * width) ** 2 + (yy - centre[1] * height) ** 2 <= radius**2
    image[inside] = colour
    return image


def targets(blob: np.ndarray, task: int, mix: np.ndarray) -> np.ndarray:
    """Joint targets [T, A]: a fixed linear map `mix` [3, A] of the blob position and task (degree-like)."""
    features = np.concatenate([blob - 0.5, np.full((len(blob), 1), 2.0 * task - 1.0)], axis=1)  # [T, 3]
    return 60.0 * features @ mix


def record(spec: Spec, out: Path, seed: int) -> Path:
    """Record one dataset with LeRobot's API; returns its folder."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = out / spec.name
    if root.exists():
        shutil.rmtree(root)
    dataset = LeRobotDataset.create(
        repo_id=f"embodrl/{spec.name}",
        fps=spec.fps,
        features=features(spec),
        root=root,
        robot_type=spec.robot_type,
        use_videos=spec.use_videos,
    )
    rng = np.random.default_rng(seed)
    action_dim, state_dim = len(spec.action_names), len(spec.state_names)
    mix = np.random.default_rng(1000 + seed).normal(size=(3, action_dim))
    (blob_key, (bh, bw)), *others = spec.cameras.items()
    for episode in range(spec.episodes):
        task = episode % len(spec.tasks)
        blob = blob_path(episode, spec.frames, rng)
        goal = targets(blob, task, mix)
        state = rng.normal(scale=5.0, size=state_dim)
        for t in range(spec.frames):
            action = state[:action_dim] + GAIN * (goal[t] - state[:action_dim])
            frame = {
                "observation.state": state.astype(np.float32),
                "action": action.astype(np.float32),
                blob_key: draw(bh, bw, blob[t], (220, 40, 40) if task == 0 else (40, 200, 60)),
                "task": spec.tasks[task],
            }
            for key, (h, w) in others:  # the wrist view: the blob seen from the gripper, mirrored
                frame[key] = draw(h, w, 1.0 - blob[t], (240, 220, 60))
            dataset.add_frame(frame)
            state = state.copy()
            state[:action_dim] = action  # the arm reaches the commanded position
        dataset.save_episode()
    dataset.finalize()
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the datasets")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for i, spec in enumerate(SPECS):
        root = record(spec, args.out, args.seed + i)
        size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        print(f"{root}: {spec.episodes} episodes x {spec.frames} frames, {size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
