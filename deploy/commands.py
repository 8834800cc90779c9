"""Entry points behind `embodrl serve CHECKPOINT` and `embodrl deploy CONFIG`."""

from __future__ import annotations

import dataclasses
import logging
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from embodrl.deploy.config import (
    DeployConfig,
    ObservationKeys,
    RobotConfig,
    ServerConfig,
    dataset_request_keys,
    robot_camera,
)
from embodrl.deploy.loop import ControlLoop, EpisodeStats, Intervention
from embodrl.deploy.robot import Robot, connected, make_lerobot_robot
from embodrl.errors import UserError

if TYPE_CHECKING:
    from embodrl.deploy.server import PolicyServer

logger = logging.getLogger(__name__)


def serve(checkpoint: str, cfg: ServerConfig) -> None:
    """Load a policy checkpoint and serve it until Ctrl-C."""
    checkpoint_server(checkpoint, cfg).serve_forever()


def checkpoint_server(checkpoint: str, cfg: ServerConfig) -> PolicyServer:
    """A server (not yet started) for a policy checkpoint, speaking its dataset's key names when it was
    trained from a dataset alone and `cfg.keys` are left at openpi's defaults."""
    from embodrl.deploy.runner import CheckpointRunner
    from embodrl.deploy.server import PolicyServer

    runner = CheckpointRunner(checkpoint, device=cfg.device)
    logger.info(
        "loaded %s (%s, chunks [%d, %d])",
        checkpoint,
        runner.family,
        runner.action_horizon,
        runner.action_dim,
    )
    keys = request_keys(cfg.keys, runner.dataset_features)
    if keys != cfg.keys:
        logger.info("request keys as in the policy's dataset: %s", dataclasses.asdict(keys))
    return PolicyServer(runner, dataclasses.replace(cfg, keys=keys))


def request_keys(keys: ObservationKeys, dataset_features: dict[str, str]) -> ObservationKeys:
    """`keys` as configured; left at openpi's defaults for a policy trained from a dataset alone, the names
    of that dataset's features (observation.images.front, observation.state, task)."""
    if dataset_features and keys == ObservationKeys():
        return dataset_request_keys(dataset_features)
    return keys


def speak_like_the_policy(
    cfg: DeployConfig, dataset_features: dict[str, str], server_keys: dict[str, Any] | None = None
) -> DeployConfig:
    """`cfg` with the request keys the policy expects (a server's, as its metadata says; else those of the
    dataset a local checkpoint was trained on) and, where robot.camera / wrist_camera are unset, the robot
    cameras that dataset was recorded with (observation.images.front -> camera front)."""
    if server_keys and cfg.keys == ObservationKeys():
        keys = ObservationKeys(**{**server_keys, "state": tuple(server_keys["state"])})
    else:
        keys = request_keys(cfg.keys, dataset_features)
    robot = cfg.robot
    for obs_key, setting in (("rgb", "camera"), ("wrist_rgb", "wrist_camera")):
        if obs_key in dataset_features and not getattr(robot, setting):
            robot = dataclasses.replace(robot, **{setting: robot_camera(dataset_features[obs_key])})
            logger.info(
                "robot.%s=%s (the camera of %s)", setting, getattr(robot, setting), dataset_features[obs_key]
            )
    return dataclasses.replace(cfg, keys=keys, robot=robot)


def make_robot(cfg: RobotConfig) -> Robot:
    """The robot named by `robot.kind` (not yet connected)."""
    if cfg.kind == "sim":
        from embodrl.deploy.sim_robot import SimRobot

        return SimRobot(cfg)
    if cfg.kind == "replay":
        from embodrl.deploy.replay_robot import ReplayRobot

        return ReplayRobot(cfg)
    if cfg.kind == "lerobot":
        return make_lerobot_robot(cfg.lerobot_config, cfg.lerobot_kwargs)
    from embodrl.deploy.franka import FrankaRobot

    return FrankaRobot(cfg.franka_host, cfg.franka_dynamics)


def deploy(
    cfg: DeployConfig, robot: Robot | None = None, intervention: Intervention | None = None
) -> list[EpisodeStats]:
    """Run `cfg.episodes` episodes on the robot (built from cfg.robot unless given); returns their stats.

    `intervention` is the human takeover hook; without one, `teleop.keyboard=true` reads the terminal.
    """
    robot = robot or make_robot(cfg.robot)
    with ExitStack() as stack:
        if intervention is None and cfg.teleop.keyboard:
            from embodrl.deploy.teleop import keyboard_teleop

            intervention = stack.enter_context(keyboard_teleop(cfg, len(robot.action_features)))
        return _run_episodes(cfg, robot, intervention)


def check_episodes(results: list[EpisodeStats]) -> None:
    """A UserError (a non-zero exit) when episodes ended in a safe stop: inference failed or came too late
    for the watchdog, or the chunks were refused; an operator's script must not read that as success."""
    stopped = [i for i, stats in enumerate(results) if stats.stop_reason == "safe_stop"]
    if stopped:
        errors = sum(results[i].inference_errors for i in stopped)
        raise UserError(
            f"{len(stopped)} of {len(results)} episode(s) ended in a safe stop (episodes {stopped}, "
            f"{errors} inference error(s)); the log says why"
        )


def _run_episodes(cfg: DeployConfig, robot: Robot, intervention: Intervention | None) -> list[EpisodeStats]:
    from embodrl.deploy.client import PolicyClient
    from embodrl.deploy.inference import LocalPolicy, RemotePolicy

    if cfg.remote:
        client = PolicyClient(cfg.policy, api_key=cfg.api_key, wait_s=10.0)
        metadata = client.metadata
        cfg = speak_like_the_policy(
            cfg, metadata.get("dataset_features", {}), metadata.get("observation_keys")
        )
        source, release = RemotePolicy(client), client.close
    else:
        from embodrl.deploy.runner import CheckpointRunner

        runner = CheckpointRunner(cfg.policy)
        cfg = speak_like_the_policy(cfg, runner.dataset_features)
        source, release = LocalPolicy(runner, cfg.keys), None
    results = []
    try:
        with connected(robot):
            loop = ControlLoop(cfg, robot, source, cfg.record_dir, intervention)
            try:
                for episode in range(cfg.episodes):
                    if episode and hasattr(robot, "reset_episode"):
                        robot.reset_episode()
                    prompt = cfg.prompt or getattr(robot, "instruction", "")
                    results.append(loop.run_episode(prompt))
                    logger.info("episode %d: %s", episode, results[-1].as_dict())
            finally:
                loop.close()
    finally:
        if release is not None:
            release()
    return results
