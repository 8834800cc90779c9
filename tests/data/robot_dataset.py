"""A small dataset shaped like one recorded on a LeRobot arm (SO-100 style: 6 named joints, a front and a
wrist camera, two task strings), written with embodrl's writer, for tests of training without a simulator.

The action moves the joints toward a target read off the front camera (where a red square sits), so a policy
that sees the image and the state can learn it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embodrl.data.lerobot_writer import LeRobotDatasetWriter

SO100_MOTORS = (  # LeRobot's SO-100 motor names
    "shoulder_pan.pos",
    "shoulder_lift.pos",
    "elbow_flex.pos",
    "wrist_flex.pos",
    "wrist_roll.pos",
    "gripper.pos",
)
TASKS = ("grab the block", "pick up the red block")
SIZE = 32


def write_robot_dataset(root: Path, episodes: int = 6, length: int = 12, seed: int = 0) -> Path:
    names = list(SO100_MOTORS)
    image = {"dtype": "video", "shape": [SIZE, SIZE, 3], "names": ["height", "width", "channels"]}
    features = {
        "observation.state": {"dtype": "float32", "shape": [6], "names": names},
        "action": {"dtype": "float32", "shape": [6], "names": names},
        "observation.images.front": image,
        "observation.images.wrist": image,
    }
    rng = np.random.default_rng(seed)
    with LeRobotDatasetWriter(root, 10, features, robot_type="so100_follower") as writer:
        for episode in range(episodes):
            x, y = rng.integers(2, SIZE - 8, size=2)
            target = np.array([x / 16 - 1, y / 16 - 1, 0, 0, 0, 1], np.float32)
            state = rng.normal(size=6).astype(np.float32)
            for t in range(length):
                front = np.zeros((SIZE, SIZE, 3), np.uint8)
                front[y : y + 6, x : x + 6, 0] = 255
                wrist = np.full((SIZE, SIZE, 3), 40, np.uint8)
                wrist[..., 1] = 10 * t
                action = state + 0.3 * (target - state)
                writer.add_frame(
                    {
                        "observation.state": state,
                        "action": action,
                        "observation.images.front": front,
                        "observation.images.wrist": wrist,
                    }
                )
                state = action
            writer.save_episode(TASKS[episode % 2])
    return root
