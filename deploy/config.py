"""Deploy configuration: server, observation keys, safety, chunk execution, robot, loop (torch-free)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError
from embodrl.structured import load_structured

CHUNK_MODES = ("open_loop", "blend", "rtc", "guided_rtc")
REAL_TIME_MODES = ("rtc", "guided_rtc")  # modes that query inference_delay_steps early
ROBOT_KINDS = ("sim", "lerobot", "franka", "replay")
ACTION_TYPES = ("delta", "absolute")
API_KEY_VARIABLE = "EMBODRL_API_KEY"  # the server's and the client's key, when not given in the config


def api_key_or_environment(api_key: str | None) -> str | None:
    """The configured key, else EMBODRL_API_KEY's (which keeps it out of command lines and histories)."""
    return api_key if api_key is not None else os.environ.get(API_KEY_VARIABLE) or None


@dataclass
class ObservationKeys:
    """Request keys (openpi's names by default) that feed each embodrl observation key."""

    image: str = "observation/image"  # -> rgb, uint8 [H, W, 3], resized server-side
    wrist_image: str = "observation/wrist_image"  # -> wrist_rgb
    state: tuple[str, ...] = ("observation/state",)  # -> state, concatenated in this order
    prompt: str = "prompt"  # -> instruction
    task_id: str = "task_id"  # -> task_id (policies trained on task ids instead of language)


LEROBOT_CAMERA_PREFIX = "observation.images."  # LeRobot names a camera's feature after the robot's camera


def dataset_request_keys(features: dict[str, str]) -> ObservationKeys:
    """Request keys named as the dataset a policy was trained on names its features (obs key -> feature,
    e.g. rgb -> observation.images.front, state -> observation.state), the prompt as LeRobot's `task`."""
    default = ObservationKeys()
    return ObservationKeys(
        image=features.get("rgb", default.image),
        wrist_image=features.get("wrist_rgb", default.wrist_image),
        state=(features["state"],) if "state" in features else default.state,
        prompt="task",
    )


def robot_camera(feature: str) -> str:
    """The robot camera behind a dataset feature (observation.images.front -> front)."""
    return feature.removeprefix(LEROBOT_CAMERA_PREFIX)


# DROID's request keys (openpi examples/droid): two arrays make up the state.
DROID_KEYS = ObservationKeys(
    image="observation/exterior_image_1_left",
    wrist_image="observation/wrist_image_left",
    state=("observation/joint_position", "observation/gripper_position"),
)


@dataclass
class ServerConfig:
    """`embodrl serve`: where to listen and how much a client may ask of the server."""

    host: str = "127.0.0.1"  # "0.0.0.0" to accept robots on other machines
    port: int = 8000  # openpi's default; 0 picks a free port
    # when set, clients must send `Authorization: Api-Key <key>`; unset: the EMBODRL_API_KEY variable
    api_key: str | None = None
    max_message_bytes: int = 32 * 2**20  # larger frames close the connection (code 1009)
    request_timeout_s: float = 30.0  # a request not answered by then gets an error reply
    max_batch_size: int = 16  # concurrent requests served by one batched `act`
    batch_window_ms: float = 0.0  # extra wait for more requests; 0: batch what queued during the last call
    max_pending: int = 64  # queued requests beyond this are answered "server busy"
    device: str = "cpu"
    keys: ObservationKeys = field(default_factory=ObservationKeys)

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"server.port={self.port} must be in [0, 65535]")
        for key in ("max_message_bytes", "request_timeout_s", "max_batch_size", "max_pending"):
            check_positive(f"server.{key}", getattr(self, key))
        check_positive("server.batch_window_ms", self.batch_window_ms, allow_zero=True)
        if self.api_key == "":
            raise ConfigError("server.api_key is empty; leave it unset (null) or give a non-empty key")
        self.api_key = api_key_or_environment(self.api_key)


@dataclass
class SafetyConfig:
    """The safety layer between chunks and the robot (on by default; every intervention is counted).

    Limits are per action dimension (one value applies to all dims). Rates act on the commanded
    action sequence: `max_relative_target` is per step (LeRobot's name), velocity and acceleration
    are per second at the loop's fps. The gripper dimension is exempt from rate limits.
    """

    enabled: bool = True
    action_low: tuple[float, ...] = (-1.0,)
    action_high: tuple[float, ...] = (1.0,)
    max_relative_target: tuple[float, ...] | None = (0.5,)  # |a_t - a_{t-1}| per step
    max_velocity: tuple[float, ...] | None = None  # units/s
    max_acceleration: tuple[float, ...] | None = None  # units/s^2
    gripper_dim: int | None = -1  # index of the gripper command in the action, None if absent
    gripper_low: float = -1.0  # gripper command limits (close force / opening)
    gripper_high: float = 1.0
    workspace_low: tuple[float, float, float] | None = None  # end-effector box (m), None: unchecked
    workspace_high: tuple[float, float, float] | None = None
    action_type: str = "delta"  # "delta" (hold = zeros) or "absolute" targets (hold = the last target)
    ee_dims: tuple[int, int, int] = (0, 1, 2)  # action dims that move the end effector in x, y, z
    ee_delta_scale: float = 0.02  # m per unit of delta action (the tabletop controller's POS_SCALE)
    ee_position_features: tuple[str, ...] = ("ee.x", "ee.y", "ee.z")  # robot features of the EE position
    max_chunk_jump: float | None = 1.0  # max |first action of a new chunk - last sent action|
    watchdog_hold_s: float = 0.2  # no fresh action for this long: hold position
    watchdog_stop_s: float = 1.0  # ... for this long: safe stop (the episode ends)

    def __post_init__(self) -> None:
        check_choice("safety.action_type", self.action_type, ACTION_TYPES)
        if (self.workspace_low is None) != (self.workspace_high is None):
            raise ConfigError("safety.workspace_low and safety.workspace_high must be set together")
        check_positive("safety.watchdog_hold_s", self.watchdog_hold_s)
        if self.watchdog_stop_s < self.watchdog_hold_s:
            raise ConfigError(
                "safety.watchdog_stop_s must be >= safety.watchdog_hold_s (hold first, then stop)"
            )
        if self.gripper_low > self.gripper_high:
            raise ConfigError("safety.gripper_low must be <= safety.gripper_high")


@dataclass
class ChunkConfig:
    """How action chunks [H, A] become one action per control step."""

    # open_loop: N of H then re-query | blend: weighted overlap | rtc: early query, cross-faded overlap |
    # guided_rtc: early query whose chunk the policy inpaints toward the rest of the plan (flow policies)
    mode: str = "open_loop"
    action_horizon: int = 4  # H: must equal the policy's chunk_size (checked against the server)
    execute_steps: int = 4  # N: actions executed from each chunk before the next is used
    blend_new_weight: float = 0.7  # blend: new = w * new + (1 - w) * old on overlapping steps
    inference_delay_steps: int = 1  # rtc, guided_rtc: steps expected to pass while the next chunk is computed

    def __post_init__(self) -> None:
        check_choice("chunk.mode", self.mode, CHUNK_MODES)
        check_positive("chunk.action_horizon", self.action_horizon)
        check_positive("chunk.execute_steps", self.execute_steps)
        if self.execute_steps > self.action_horizon:
            raise ConfigError(
                f"chunk.execute_steps={self.execute_steps} exceeds chunk.action_horizon={self.action_horizon}"
            )
        if not 0.0 <= self.blend_new_weight <= 1.0:
            raise ConfigError(f"chunk.blend_new_weight={self.blend_new_weight} must be in [0, 1]")
        check_positive("chunk.inference_delay_steps", self.inference_delay_steps, allow_zero=True)
        if self.mode in REAL_TIME_MODES and self.inference_delay_steps >= self.execute_steps:
            raise ConfigError(f"chunk.inference_delay_steps must be < chunk.execute_steps for {self.mode}")


@dataclass
class RobotConfig:
    """Which robot the loop drives."""

    kind: str = "sim"  # sim: MuJoCo tabletop stand-in | lerobot: a LeRobot Robot | franka: franky
    suite: str = "tabletop-basic"  # sim: the embodrl suite and task to simulate
    task: str = "reach"
    seed: int = 0
    latency_s: float = 0.0  # sim: extra delay of every get_observation (injected link latency)
    dropout_prob: float = 0.0  # sim: probability that send_action is lost
    camera: str = ""  # observation feature sent as the main image ("" : none); sim: "rgb"
    wrist_camera: str = ""  # observation feature sent as the wrist image; sim: "wrist_rgb"
    lerobot_config: str = ""  # lerobot: "module:ConfigClass" of the LeRobot robot
    lerobot_kwargs: dict = field(default_factory=dict)  # lerobot: the fields of that config
    franka_host: str = ""  # franka: the robot's FCI address
    franka_dynamics: float = 0.05  # franka: relative dynamics factor (fraction of max vel/acc/jerk)
    dataset: str = ""  # replay: a LeRobot dataset whose recorded episodes play the robot (open loop)
    episode: int = 0  # replay: the first recorded episode to play

    def __post_init__(self) -> None:
        check_choice("robot.kind", self.kind, ROBOT_KINDS)
        check_positive("robot.latency_s", self.latency_s, allow_zero=True)
        if not 0.0 <= self.dropout_prob < 1.0:
            raise ConfigError(f"robot.dropout_prob={self.dropout_prob} must be in [0, 1)")
        if self.kind == "lerobot" and not self.lerobot_config:
            raise ConfigError("robot.kind=lerobot needs robot.lerobot_config (module:ConfigClass)")
        if self.kind == "replay" and not self.dataset:
            raise ConfigError("robot.kind=replay needs robot.dataset (a LeRobot dataset folder or repo id)")
        if self.kind == "franka" and not self.franka_host:
            raise ConfigError("robot.kind=franka needs robot.franka_host (the FCI address)")
        if not 0.0 < self.franka_dynamics <= 1.0:
            raise ConfigError(f"robot.franka_dynamics={self.franka_dynamics} must be in (0, 1]")


@dataclass
class TeleopConfig:
    """Keyboard takeover during `embodrl deploy` (deploy/teleop.py), for delta end-effector actions.

    Keys move the action dims `safety.ee_dims`; space toggles `safety.gripper_dim` between
    `safety.gripper_low` (where it starts) and `safety.gripper_high`.
    """

    keyboard: bool = False  # read keys from this terminal; Enter hands control to the human and back
    step: float = 0.5  # action units per step on an axis whose key is pressed (tabletop: 0.5 -> 1 cm)

    def __post_init__(self) -> None:
        check_positive("teleop.step", self.step)


RESET_MODES = ("auto", "robot", "home", "operator")


@dataclass
class ResetConfig:
    """How the scene is reset between the episodes of a learning robot (`embodrl actor --robot`).

    robot: the robot's own reset (the sim stand-in's); home: a scripted move to `home` through the safety
    layer; operator: wait for the operator's Enter on the terminal; auto: robot where the robot has one,
    else operator.
    """

    mode: str = "auto"
    # home: the end-effector position [x, y, z] (m) for delta actions, the target action [A] for absolute
    home: tuple[float, ...] | None = None
    home_steps: int = 100  # home: the longest move, in control steps
    home_tolerance: float = 0.005  # home: arrived when every coordinate is this close

    def __post_init__(self) -> None:
        check_choice("reset.mode", self.mode, RESET_MODES)
        if self.mode == "home" and not self.home:
            raise ConfigError("reset.mode=home needs reset.home (the EE position [x, y, z] or target action)")
        check_positive("reset.home_steps", self.home_steps)
        check_positive("reset.home_tolerance", self.home_tolerance)


@dataclass
class RobotLoopConfig:
    """What the robot loop (deploy/loop.py) runs by: the robot, its rate and limits, keys, teleop."""

    fps: float = 10.0
    max_steps: int = 200  # per episode
    prompt: str = ""  # instruction sent with every observation ("" : the robot's own task)
    record_dir: str = ""  # write episodes as a LeRobotDataset v3 here ("" : no recording)
    robot: RobotConfig = field(default_factory=RobotConfig)
    chunk: ChunkConfig = field(default_factory=ChunkConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    keys: ObservationKeys = field(default_factory=ObservationKeys)
    teleop: TeleopConfig = field(default_factory=TeleopConfig)

    def __post_init__(self) -> None:
        check_positive("deploy.fps", self.fps)
        check_positive("deploy.max_steps", self.max_steps)
        if self.teleop.keyboard and self.safety.action_type != "delta":
            raise ConfigError(
                "teleop.keyboard sends delta end-effector actions; with safety.action_type=absolute its "
                "zeros would be targets. Use it with delta actions only"
            )


@dataclass
class DeployConfig(RobotLoopConfig):
    """`embodrl deploy CONFIG`: the robot-side loop with a trained policy."""

    policy: str = ""  # a checkpoint folder (local inference) or ws://host:port (remote server)
    api_key: str | None = None  # for a remote server that requires one; unset: EMBODRL_API_KEY
    episodes: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        self.api_key = api_key_or_environment(self.api_key)
        if not self.policy:
            raise ConfigError(
                "deploy.policy is empty; give a checkpoint folder or ws://host:port of `embodrl serve`"
            )
        check_positive("deploy.episodes", self.episodes)

    @property
    def remote(self) -> bool:
        return self.policy.startswith(("ws://", "wss://"))


def load_config(cls: type, path: str | None, overrides: list[str] | tuple[str, ...] = ()):
    """A DeployConfig/ServerConfig from an optional YAML file plus `key=value` overrides."""
    return load_structured(cls, path, overrides)
