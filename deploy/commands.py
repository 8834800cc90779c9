"""Entry points behind `embodrl serve CHECKPOINT` and `embodrl deploy CONFIG`."""

from __future__ import annotations

import logging
from contextlib import ExitStack

from embodrl.deploy.config import DeployConfig, RobotConfig, ServerConfig
from embodrl.deploy.loop import ControlLoop, EpisodeStats, Intervention
from embodrl.deploy.robot import Robot, connected, make_lerobot_robot
from embodrl.errors import UserError

logger = logging.getLogger(__name__)


def serve(checkpoint: str, cfg: ServerConfig) -> None:
    """Load a policy checkpoint and serve it until Ctrl-C."""
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
    PolicyServer(runner, cfg).serve_forever()


def make_robot(cfg: RobotConfig) -> Robot:
    """The robot named by `robot.kind` (not yet connected)."""
    if cfg.kind == "sim":
        from embodrl.deploy.sim_robot import SimRobot

        return SimRobot(cfg)
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
        source, release = RemotePolicy(client), client.close
    else:
        from embodrl.deploy.runner import CheckpointRunner

        source, release = LocalPolicy(CheckpointRunner(cfg.policy), cfg.keys), None
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
