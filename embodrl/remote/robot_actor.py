"""`embodrl actor --robot`: a robot that learns: `embodrl deploy`'s control loop around the learner's policy,
streaming every step to the learner as a transition.

Per episode: reset the scene (`reset.*`: the robot's own reset, a scripted move home through the safety
layer, or the operator's Enter), then run the control loop (deploy/loop.py) with the learner's policy as
its chunk source. Every action, the policy's sample (uniform over safety.action_low/high while no weights
have arrived), or the human's who took over (teleop), goes through the safety layer, whose end-effector
workspace box is on by default here (robot_config.py). Each step becomes a transition: the policy's
observation, the action the robot really executed, reward 1 and terminated once the task is done (the
robot's success, or the operator's mark) and the `intervention` flag where a human drove. They go to the
learner in batches of `batch_steps` and at each episode's end, with the episode's return, success,
intervention rate and safety counts (the learner logs them as rollout/*); newer weights are loaded before
each inference. An episode ends on success, at max_steps, or in a safe stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from embodrl.choices import check_positive
from embodrl.data.replay_buffer import step_transitions
from embodrl.deploy.commands import make_robot
from embodrl.deploy.guidance import to_runner_observation
from embodrl.deploy.inference import LocalPolicy
from embodrl.deploy.loop import ControlLoop, EpisodeStats, Intervention
from embodrl.deploy.observations import RequestError
from embodrl.deploy.recording import StepRecord
from embodrl.deploy.reset import reset_scene
from embodrl.deploy.robot import Robot, connected
from embodrl.deploy.runner import InputSpec, ModelRunner
from embodrl.errors import UserError
from embodrl.obs_keys import key_dtype
from embodrl.remote.actor import (
    ActorStats,
    PolicyCopy,
    TransitionBatches,
    actor_seed,
    learner_connection,
    status_line,
)
from embodrl.remote.client import LearnerClient
from embodrl.remote.config import ActorConnectionConfig
from embodrl.remote.robot_config import RobotActorConfig, learning_loop

logger = logging.getLogger(__name__)


class LearnerPolicyRunner(ModelRunner):
    """The learner's policy as the loop's chunk source: the newest weights loaded before each inference, its
    actions sampled (exploration); uniform over [low, high] [A] while no weights have arrived. Its inputs
    are all the keys the learner wants sent (the policy's, and its reward model's)."""

    def __init__(self, copy: PolicyCopy, low: np.ndarray, high: np.ndarray, seed: int) -> None:
        super().__init__(copy.policy, deterministic=False)
        self.copy, self.low, self.high = copy, low, high
        self.rng = np.random.default_rng(seed)
        spec = copy.client.policy_spec
        for key in spec["read_keys"]:
            self.input_spec.setdefault(key, InputSpec(tuple(spec["obs_shapes"][key]), key_dtype(key)))

    def infer_batch(self, observations: list[dict[str, Any]]) -> np.ndarray:
        self.copy.refresh()
        if self.copy.version:
            return super().infer_batch(observations)
        uniform = self.rng.random((len(observations), self.action_horizon, self.action_dim))
        return (self.low + (self.high - self.low) * uniform).astype(np.float32)


def episode_outcome(stats: EpisodeStats, reward: float) -> dict[str, float]:
    """What the learner logs of one robot episode (protocol.py's `episodes`): return, length, success, the
    share of steps a human drove, and the safety layer's counts."""
    return {
        "episodes": 1.0,
        "return": reward,
        "length": float(stats.steps),
        "success": float(stats.success),
        "intervention_rate": stats.intervention_rate,
        **{name: float(count) for name, count in stats.safety.items()},
    }


def episode_line(number: int, stats: EpisodeStats, version: int) -> str:
    """One line per episode: how it ended, the intervention rate, the safety clamps it needed and whether
    the loop kept its rate."""
    counts = ", ".join(f"{name} {count}" for name, count in stats.safety.items() if count) or "none"
    ended = "success" if stats.success else stats.stop_reason
    return (
        f"episode {number}: {stats.steps} steps, {ended}, intervention rate "
        f"{stats.intervention_rate:.0%}, safety: {counts}; loop {stats.loop_ms_p50:.1f} ms "
        f"(p50), {stats.late_ticks} late, {stats.starved_steps} without an action; weights v{version}"
    )


class RobotActor:
    """Runs learning episodes on a connected `robot` with the learner's policy, streaming them to `client`."""

    def __init__(
        self,
        cfg: RobotActorConfig,
        robot: Robot,
        client: LearnerClient,
        batch_steps: int,
        seed: int = 0,
        device: str = "cpu",
        intervention: Intervention | None = None,
        read_line: Callable[[str], Any] = input,
    ) -> None:
        check_positive("--batch-steps", batch_steps)
        spec = client.policy_spec
        if spec["policy"]["chunk_size"] != 1:
            raise UserError(
                f"a robot actor sends one action a decision; the learner's policy acts in chunks of "
                f"{spec['policy']['chunk_size']}: train it with policy.chunk_size=1"
            )
        self.cfg, self.loop_cfg = cfg, learning_loop(cfg)
        self.robot, self.client, self.batch_steps, self.read_line = robot, client, batch_steps, read_line
        self.keys = tuple(spec["read_keys"])
        self.seed = actor_seed(seed, client.cfg.actor_id)
        self.copy = PolicyCopy(client, device)
        low, high = (
            np.broadcast_to(np.asarray(bound, dtype=np.float64), (spec["policy"]["action_dim"],))
            for bound in (cfg.safety.action_low, cfg.safety.action_high)
        )
        self.runner = LearnerPolicyRunner(self.copy, low, high, self.seed)
        self.loop = ControlLoop(
            self.loop_cfg,
            robot,
            LocalPolicy(self.runner, cfg.keys),
            cfg.record_dir,
            intervention,
            on_step=self._observe,
            stop_when_done=True,
        )
        self.batches = TransitionBatches(client)
        self.stats = ActorStats()
        self.prompt = ""
        self._previous: tuple[dict[str, np.ndarray], np.ndarray, bool] | None = None  # awaits its next obs
        self._return = 0.0
        self.episode_stats: list[EpisodeStats] = []

    def run(self, decisions: int = 0) -> ActorStats:
        """Play episodes until `cfg.episodes` (0: no limit), the episode in which `decisions` transitions
        were reached (0: no limit), or the learner finished its run; whatever is pending is sent too."""
        torch.manual_seed(self.seed)  # the policy's samples
        self._policy_obs(self.robot.get_observation())  # a robot that does not fit fails before moving
        try:
            while not self.client.finished and not self._enough(decisions):
                reset_scene(
                    self.cfg.reset, self.robot, self.loop.io, self.loop.safety, self.cfg.fps, self.read_line
                )
                self.prompt = self.cfg.prompt or getattr(self.robot, "instruction", "")
                self._previous, self._return = None, 0.0
                stats = self.loop.run_episode(self.prompt)
                self._end_episode(stats)
        finally:
            self.batches.send_rest(len(self.batches.pending))  # an episode cut short: what it sent so far
            self.loop.close()
        return self.stats

    def _enough(self, decisions: int) -> bool:
        played = self.cfg.episodes and self.stats.episodes >= self.cfg.episodes
        return bool(played or (decisions and self.stats.decisions >= decisions))

    def _policy_obs(self, observation: dict[str, Any]) -> dict[str, np.ndarray]:
        """The observation as the learner's policy reads it (the keys the transitions carry)."""
        request = self.loop.io.request(observation, self.prompt)
        try:
            obs = to_runner_observation(request, self.cfg.keys, self.runner)
        except RequestError as error:
            raise UserError(f"the robot's observation does not fit the learner's policy: {error}") from None
        return {key: np.asarray(obs[key]) for key in self.keys}

    def _observe(self, record: StepRecord) -> None:
        """A step of the loop: it completes the previous step's transition (its next observation, and its
        reward: the task done in it)."""
        obs = self._policy_obs(record.observation)
        if self._previous is not None:
            self._add(*self._previous, obs, record.success)
            if len(self.batches.pending) == self.batch_steps:
                self.batches.send(self.batch_steps)
        self._previous = (obs, record.sent, record.teleop)

    def _add(
        self, obs: dict[str, np.ndarray], action: np.ndarray, teleop: bool, next_obs: dict, done: bool
    ) -> None:
        def batch(observation: dict[str, np.ndarray]) -> TensorDict:
            tensors = {key: torch.from_numpy(np.asarray(value))[None] for key, value in observation.items()}
            return TensorDict(tensors, batch_size=[1])

        transition = step_transitions(
            batch(obs),
            torch.as_tensor(action, dtype=torch.float32).view(1, 1, -1),
            torch.tensor([[float(done)]]),
            batch(next_obs),
            torch.tensor([done]),
        )
        transition["intervention"] = torch.tensor([teleop])
        self._return += float(done)
        self.stats.decisions += 1
        self.stats.env_steps += 1
        self.batches.add(transition)

    def _end_episode(self, stats: EpisodeStats) -> None:
        if self._previous is not None:  # the last step's next observation: where the robot ended up
            self._add(*self._previous, self._policy_obs(self.robot.get_observation()), stats.success)
            self._previous = None
        self.stats.episodes += 1
        self.stats.version = self.copy.version
        self.episode_stats.append(stats)
        if self.batches.pending:  # (none when the episode had no step)
            self.batches.send(len(self.batches.pending), episode_outcome(stats, self._return))
        print(episode_line(self.stats.episodes, stats, self.copy.version), flush=True)
        logger.info("%s", self.status())

    def status(self) -> str:
        return status_line(self.client, self.stats)


def run_robot_actor(
    cfg: RobotActorConfig,
    conn: ActorConnectionConfig,
    batch_steps: int,
    decisions: int = 0,
    flush_s: float = 10.0,
    device: str = "cpu",
    robot: Robot | None = None,
    intervention: Intervention | None = None,
    read_line: Callable[[str], Any] = input,
) -> tuple[RobotActor, str]:
    """Connect to the learner and the robot (built from cfg.robot unless given), learn, and before leaving
    wait up to `flush_s` for the unacknowledged batches; returns the actor and its last status line.
    `intervention` is the human takeover hook; without one, `teleop.keyboard=true` reads the terminal."""
    robot = robot or make_robot(cfg.robot)
    with learner_connection(conn, flush_s) as client, ExitStack() as stack:
        stack.enter_context(connected(robot))
        if intervention is None and cfg.teleop.keyboard:
            from embodrl.deploy.teleop import keyboard_teleop

            intervention = stack.enter_context(keyboard_teleop(cfg, len(robot.action_features)))
        actor = RobotActor(cfg, robot, client, batch_steps, cfg.robot.seed, device, intervention, read_line)
        actor.run(decisions)
    return actor, actor.status()
