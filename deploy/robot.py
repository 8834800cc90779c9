"""The Robot protocol (LeRobot's shape) and how the loop talks to any robot that has it.

A robot has `observation_features` / `action_features` (flat dicts: float features are motors or
state, tuple features `(H, W, 3)` are cameras), `connect()`, `get_observation()`,
`send_action(action) -> action actually sent`, `disconnect()`. A LeRobot `Robot` object satisfies it
as it is (duck typing: the lerobot package is never imported unless a LeRobot robot is asked for).
`RobotIO` turns these flat dicts into policy requests and action vectors.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

import numpy as np

from embodrl.deploy.config import ObservationKeys
from embodrl.errors import UserError

ROBOT_MEMBERS = (
    "observation_features",
    "action_features",
    "connect",
    "get_observation",
    "send_action",
    "disconnect",
)


@runtime_checkable
class Robot(Protocol):
    """What the deploy loop needs from a robot (LeRobot's `Robot` has all of it)."""

    @property
    def observation_features(self) -> dict[str, Any]: ...

    @property
    def action_features(self) -> dict[str, Any]: ...

    def connect(self) -> None: ...

    def get_observation(self) -> dict[str, Any]: ...

    def send_action(self, action: dict[str, Any]) -> dict[str, Any]: ...

    def disconnect(self) -> None: ...


class RobotBase(ABC):
    """Base of embodrl's own adapters: the protocol plus LeRobot's context-manager behaviour."""

    is_connected: bool = False

    @property
    @abstractmethod
    def observation_features(self) -> dict[str, Any]: ...

    @property
    @abstractmethod
    def action_features(self) -> dict[str, Any]: ...

    @abstractmethod
    def connect(self) -> None: ...

    @abstractmethod
    def get_observation(self) -> dict[str, Any]: ...

    @abstractmethod
    def send_action(self, action: dict[str, Any]) -> dict[str, Any]: ...

    @abstractmethod
    def disconnect(self) -> None: ...

    def __enter__(self) -> RobotBase:
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.disconnect()


class MotorsAndCameras(RobotBase):
    """A robot whose observation is named motors (floats, `state_names`) and cameras of fixed shapes
    (`camera_shapes`), and whose action is named motors (`action_names`)."""

    state_names: tuple[str, ...] | list[str]
    action_names: tuple[str, ...] | list[str]

    @property
    @abstractmethod
    def camera_shapes(self) -> dict[str, tuple[int, ...]]: ...

    @property
    def observation_features(self) -> dict[str, Any]:
        return {**{name: float for name in self.state_names}, **self.camera_shapes}

    @property
    def action_features(self) -> dict[str, Any]:
        return {name: float for name in self.action_names}


def check_robot(robot: object) -> None:
    """Raise a UserError naming what a would-be robot lacks."""
    missing = [name for name in ROBOT_MEMBERS if not hasattr(robot, name)]
    if missing:
        raise UserError(
            f"{type(robot).__name__} is not a robot: it lacks {missing} (see embodrl.deploy.robot)"
        )


@contextmanager
def connected(robot: Robot) -> Iterator[Robot]:
    """connect() now, disconnect() on the way out, whatever happens in between."""
    robot.connect()
    try:
        yield robot
    finally:
        robot.disconnect()


class RobotIO:
    """Flat robot dicts <-> policy requests (openpi keys) and action vectors [A].

    The state is every float observation feature in feature order; the cameras named
    `camera` / `wrist_camera` become the request's image and wrist image.
    """

    def __init__(
        self,
        robot: Robot,
        keys: ObservationKeys,
        camera: str = "",
        wrist_camera: str = "",
        ee_position_features: tuple[str, ...] = (),
    ) -> None:
        check_robot(robot)
        features = self.features = dict(robot.observation_features)
        self.keys = keys
        self.state_names = [name for name, kind in features.items() if kind is float]
        self.action_names = list(robot.action_features)
        self.cameras = {keys.image: camera, keys.wrist_image: wrist_camera}
        for camera_name in filter(None, (camera, wrist_camera)):
            if camera_name not in features:
                raise UserError(f"the robot has no camera {camera_name!r}; its features: {list(features)}")
        absent = [name for name in ee_position_features if name not in features]
        if absent:
            raise UserError(f"the robot does not report {absent} (safety.ee_position_features)")
        self.ee_position_features = ee_position_features
        if len(keys.state) != 1:
            raise UserError("a robot's state is one request key; set keys.state to a single name")

    @property
    def action_dim(self) -> int:
        return len(self.action_names)

    def request(self, observation: dict[str, Any], prompt: str) -> dict[str, Any]:
        """The policy request for one robot observation."""
        out: dict[str, Any] = {
            self.keys.state[0]: np.asarray([observation[name] for name in self.state_names], dtype=np.float32)
        }
        for key, camera in self.cameras.items():
            if camera:
                out[key] = np.asarray(observation[camera], dtype=np.uint8)
        if prompt:
            out[self.keys.prompt] = prompt
        return out

    def ee_position(self, observation: dict[str, Any]) -> np.ndarray | None:
        if not self.ee_position_features:
            return None
        return np.asarray([observation[name] for name in self.ee_position_features], dtype=np.float64)

    def present_action(self, observation: dict[str, Any]) -> np.ndarray:
        """The robot's present position in action space [A] (absolute targets; NaN where not observed)."""
        return np.asarray([observation.get(name, np.nan) for name in self.action_names], dtype=np.float64)

    def action_dict(self, action: np.ndarray) -> dict[str, float]:
        return {name: float(value) for name, value in zip(self.action_names, action, strict=True)}

    def action_vector(self, action: dict[str, Any]) -> np.ndarray:
        return np.asarray([action[name] for name in self.action_names], dtype=np.float64)


def make_lerobot_robot(config_class: str, kwargs: dict[str, Any]) -> Robot:
    """A LeRobot robot built from its config class ("module:Class") and that config's fields."""
    try:
        from lerobot.robots.utils import make_robot_from_config
    except ImportError as error:
        raise UserError("robot.kind=lerobot needs the lerobot package: pip install lerobot") from error
    module, _, name = config_class.partition(":")
    try:
        config_cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise UserError(f"robot.lerobot_config={config_class!r} is not an importable module:Class") from error
    from lerobot.cameras.configs import CameraConfig

    kwargs = {**kwargs, "cameras": camera_configs(kwargs.get("cameras", {}), CameraConfig)}
    return make_robot_from_config(config_cls(**kwargs))


def camera_configs(cameras: dict[str, Any], registry: Any) -> dict[str, Any]:
    """LeRobot camera configs from plain dicts (YAML: {front: {type: opencv, index_or_path: 0, width: 640,
    height: 480, fps: 30}}), each built by the class that `registry` (LeRobot's CameraConfig choice registry)
    names for its `type`; configs that are already objects pass through."""
    out = {}
    for camera, config in cameras.items():
        if not isinstance(config, dict):
            out[camera] = config
            continue
        fields = dict(config)
        kind = fields.pop("type", None)
        if kind is None:
            raise UserError(
                f"robot.lerobot_kwargs.cameras.{camera} needs a type (e.g. opencv, intelrealsense)"
            )
        try:
            cls = registry.get_choice_class(kind)
        except KeyError:
            # a camera type registers when its module is imported (lerobot.cameras.<type>)
            try:
                importlib.import_module(f"{registry.__module__.rsplit('.', 1)[0]}.{kind}")
                cls = registry.get_choice_class(kind)
            except (ImportError, KeyError) as error:
                raise UserError(
                    f"robot.lerobot_kwargs.cameras.{camera}: unknown camera type {kind!r}"
                ) from error
        out[camera] = cls(**fields)
    return out
