"""Small stand-ins for deploy tests: a PolicyRunner whose actions are easy to predict."""

from __future__ import annotations

import threading

import numpy as np

from embodrl.deploy.runner import InputSpec, PolicyRunner

HORIZON, ACTION_DIM, IMAGE_SIZE = 4, 3, 8


def expected_chunk(state: np.ndarray) -> np.ndarray:
    """FakeRunner's chunk for a state: a[h, d] = sum(state) + h."""
    return np.repeat(float(np.sum(state)) + np.arange(HORIZON, dtype=np.float32)[:, None], ACTION_DIM, axis=1)


class FakeRunner(PolicyRunner):
    """Chunks from the state; records batch sizes and image shapes; `gate` can hold inference."""

    action_horizon, action_dim = HORIZON, ACTION_DIM

    def __init__(self) -> None:
        self.input_spec = {
            "rgb": InputSpec((IMAGE_SIZE, IMAGE_SIZE, 3), "uint8"),
            "state": InputSpec((2,), "float32"),
            "instruction": InputSpec((), "str", optional=True),
        }
        self.batch_sizes: list[int] = []
        self.image_shapes: list[tuple] = []
        self.instructions: list[str] = []
        self.started = threading.Event()  # set when an inference call begins
        self.gate = threading.Event()  # inference waits on it; set by default
        self.gate.set()

    def infer_batch(self, observations: list[dict]) -> np.ndarray:
        self.started.set()
        self.gate.wait(timeout=10)
        self.batch_sizes.append(len(observations))
        self.image_shapes += [o["rgb"].shape for o in observations]
        self.instructions += [o.get("instruction", "") for o in observations]
        if any(o["state"][0] == 999 for o in observations):
            raise ValueError("poisoned observation")
        return np.stack([expected_chunk(o["state"]) for o in observations])


def request(state=(0.5, 1.0), image_shape=(16, 24, 3), prompt: str | None = "pick") -> dict:
    """An openpi-style request for FakeRunner."""
    obs = {
        "observation/image": np.full(image_shape, 200, dtype=np.uint8),
        "observation/state": np.asarray(state, dtype=np.float32),
    }
    if prompt is not None:
        obs["prompt"] = prompt
    return obs


class FakeRobot:
    """A LeRobot-shaped robot (duck-typed, no embodrl base class): two motors, a gripper and a camera."""

    def __init__(self, fail_at_step: int | None = None) -> None:
        self.position = np.zeros(2)
        self.sent: list[dict] = []
        self.fail_at_step = fail_at_step
        self.is_connected = False

    @property
    def observation_features(self) -> dict:
        return {"x.pos": float, "y.pos": float, "cam": (IMAGE_SIZE, IMAGE_SIZE, 3)}

    @property
    def action_features(self) -> dict:
        return {"x.pos": float, "y.pos": float, "gripper": float}

    def connect(self) -> None:
        self.is_connected = True

    def get_observation(self) -> dict:
        if self.fail_at_step is not None and len(self.sent) == self.fail_at_step:
            raise OSError("motor bus timeout")
        return {
            "x.pos": self.position[0],
            "y.pos": self.position[1],
            "cam": np.zeros((IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8),
        }

    def send_action(self, action: dict) -> dict:
        self.sent.append(dict(action))
        self.position = np.array([action["x.pos"], action["y.pos"]])
        return dict(action)

    def disconnect(self) -> None:
        self.is_connected = False


class NaNRunner(FakeRunner):
    """Always answers with NaN chunks."""

    def infer_batch(self, observations: list[dict]) -> np.ndarray:
        return np.full((len(observations), HORIZON, ACTION_DIM), np.nan, dtype=np.float32)
