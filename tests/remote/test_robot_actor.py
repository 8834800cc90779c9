"""A robot actor (`embodrl actor --robot`) on the MuJoCo stand-in robot beside a learner in this process: its
steps arrive acknowledged as transitions, every action goes through the safety layer with the default
end-effector box, the steps a human drove arrive flagged and join the learner's demos, and a robot without a
known box is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embodrl.cli import main
from embodrl.deploy.config import ChunkConfig, ResetConfig, RobotConfig, SafetyConfig
from embodrl.deploy.sim_robot import LEARNING_WORKSPACE
from embodrl.errors import ConfigError
from embodrl.remote.config import ActorConnectionConfig
from embodrl.remote.learner import Learner
from embodrl.remote.robot_actor import run_robot_actor
from embodrl.remote.robot_config import RobotActorConfig
from tests.remote.tiny import TABLETOP_SAC, connection, serving_learner

torch.set_num_threads(1)
HUMAN_STEPS, MAX_STEPS = 15, 25


class ScriptedHuman:
    """Drives the arm straight up for the first HUMAN_STEPS steps of each episode, then hands back."""

    def __init__(self) -> None:
        self.step = 0

    def __call__(self, observation: dict) -> np.ndarray | None:
        self.step += 1
        if (self.step - 1) % MAX_STEPS >= HUMAN_STEPS:
            return None
        up = np.zeros(7)
        up[2], up[6] = 1.0, -1.0  # +z at full speed, gripper open
        return up


def robot_cfg(**fields) -> RobotActorConfig:
    sim = RobotConfig(kind="sim", task="reach")
    return RobotActorConfig(**{"fps": 100.0, "max_steps": MAX_STEPS, "episodes": 2, "robot": sim, **fields})


@pytest.fixture
def learner(tmp_path):
    with serving_learner(TABLETOP_SAC, tmp_path) as learner:
        yield learner


def robot_connection(learner: Learner) -> ActorConnectionConfig:
    return connection(learner, drop_when_full=True)  # as `embodrl actor --robot` connects


def test_robot_steps_arrive_acknowledged_flagged_and_inside_the_default_box(learner):
    learner._publish(1)  # the actor acts with the learner's policy, not at random
    actor, status = run_robot_actor(
        robot_cfg(), robot_connection(learner), batch_steps=4, intervention=ScriptedHuman()
    )
    assert actor.copy.version == 1 and actor.stats.episodes == 2
    assert actor.client.stats.acked_transitions == actor.stats.decisions > 0 and "0 unacked" in status
    arrivals = learner.intake.take()
    received = sum(len(a.transitions["reward"]) for a in arrivals)
    assert received == actor.stats.decisions
    # the human's steps, flagged; the policy's not
    flags = np.concatenate([a.transitions["intervention"] for a in arrivals])
    episodes = [stats for stats in actor.episode_stats]
    assert flags.sum() == sum(stats.teleop_steps for stats in episodes) == 2 * HUMAN_STEPS
    # the learner keeps every step, and the human's also as demos (HIL-SERL)
    for arrival in arrivals:
        learner._take(arrival)
    assert len(learner.buffer) == received and len(learner.demos) == 2 * HUMAN_STEPS
    sent = np.concatenate([a.transitions["action"] for a in arrivals])
    assert np.array_equal(learner.demos.data["action"][: len(learner.demos)].numpy(), sent[flags])
    # driving up leaves the default box at its top: clamped there, and the arm never got out (beyond the 2 cm
    # its controller lags behind a target: the box bounds each step's target from the measured position)
    summaries = [a.episodes for a in arrivals if a.episodes is not None]
    assert len(summaries) == 2 and all(s["workspace_clamps"] > 0 for s in summaries)
    assert all(s["intervention_rate"] == HUMAN_STEPS / s["length"] for s in summaries)
    ee = np.concatenate([a.transitions["next_obs"]["state"][:, :3] for a in arrivals])
    low, high = (np.asarray(corner) for corner in LEARNING_WORKSPACE)
    assert ee[:, 2].max() > high[2] - 0.02 and np.all(ee <= high + 0.02) and np.all(ee >= low - 0.02)


def test_every_policy_action_goes_through_the_safety_layer(learner):
    learner._publish(1)
    here = (0.2, -0.45, 0.0), (0.8, 0.45, 0.26)  # a box whose ceiling the random arm soon meets
    cfg = robot_cfg(safety=SafetyConfig(workspace_low=here[0], workspace_high=here[1]), episodes=1)
    actor, _ = run_robot_actor(cfg, robot_connection(learner), batch_steps=8)
    (stats,) = actor.episode_stats
    assert stats.teleop_steps == 0 and stats.safety["workspace_clamps"] > 0
    flags = np.concatenate([a.transitions["intervention"] for a in learner.intake.take()])
    assert not flags.any()


def test_a_robot_without_a_known_box_is_refused_in_one_line(capsys):
    franka = RobotConfig(kind="franka", franka_host="10.0.0.2")
    with pytest.raises(ConfigError, match="safety.workspace_low=.*or workspace_box=false"):
        RobotActorConfig(robot=franka)
    RobotActorConfig(robot=franka, workspace_box=False)  # the explicit opt-out
    RobotActorConfig(robot=franka, safety=SafetyConfig(workspace_low=(0, 0, 0), workspace_high=(1, 1, 1)))
    assert main(["actor", "--robot", "robot.kind=franka", "robot.franka_host=10.0.0.2"]) == 2
    error = capsys.readouterr().err.strip()
    assert "workspace_box=false" in error and "\n" not in error


def test_the_chunk_is_the_learners_and_reset_modes_are_checked():
    # one action a decision: the rate limit bounds its jump, which is not rejected (a hold) as a chunk's
    assert robot_cfg().safety.max_chunk_jump is None and robot_cfg().safety.max_relative_target == (0.5,)
    with pytest.raises(ConfigError, match="chunk"):
        robot_cfg(chunk=ChunkConfig(action_horizon=8, execute_steps=8))
    with pytest.raises(ConfigError, match="reset.home"):
        ResetConfig(mode="home")
