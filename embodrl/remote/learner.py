"""`embodrl learner`: the off-policy runner fed by remote actors instead of its own env steps.

The learner is an OffPolicyRunner whose iterations are `train.rollout_steps` (or one episode's decisions)
x env.num_envs updates of the registered algorithm, each on a batch from the replay buffer, as the local
runner's are; transitions arrive from actors through the server (learner_server.py). Updates wait for
data: the learner makes at most one update per transition received beyond `algo.learning_starts` (until
then actors act uniformly at random: they hold weights version 0). After every iteration the weights are
published as version = iteration. Its own env serves the policy's shapes and the evaluation episodes.

Nothing acknowledged is lost: each batch is in the transition log before its ack; a checkpoint holds the
replay buffer up to a log segment, and --resume replays the segments after it (a run killed before its
first checkpoint replays the whole log).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tensordict import TensorDict
from torch import nn

from embodrl.config import ExperimentConfig
from embodrl.errors import UserError
from embodrl.remote.arrays import to_arrays, to_tensors
from embodrl.remote.config import LearnerServerConfig
from embodrl.remote.intake import Arrival, Intake
from embodrl.remote.learner_server import LearnerServer
from embodrl.remote.protocol import unpackb
from embodrl.remote.transition_log import TransitionLog
from embodrl.train.learned_reward_env import LearnedRewardVecEnv
from embodrl.train.offpolicy_runner import OffPolicyRunner

log = logging.getLogger(__name__)
LOG_DIR = "transitions"  # the transition log's folder inside the run folder
WAIT_SLICE_S = 0.2


@dataclass
class RemoteState:
    """What a checkpoint holds of the remote side besides the replay buffer."""

    first_segment: int = 0  # the log segments from this one on are not in the checkpoint's buffer
    last_seq: dict[str, int] = field(default_factory=dict)  # per actor, the last batch in the buffer
    received: int = 0  # transitions taken into the buffer
    updates: int = 0


class Learner(OffPolicyRunner):
    """Trains from the actors' transitions and serves them its weights; `learn()` runs both."""

    def __init__(
        self, cfg: ExperimentConfig, run_dir: Path, server_cfg: LearnerServerConfig, resume: bool = False
    ) -> None:
        if cfg.algo.on_policy:
            raise UserError(
                f"`embodrl learner` trains off-policy from the actors' transitions; "
                f"algo.name={cfg.algo.name} learns on-policy: use algo=sac, or `embodrl train`"
            )
        if cfg.algo.noise_policy:  # the actors would have to decode the noise through the steered policy
            raise UserError(
                "algo.noise_policy is not supported by `embodrl learner` yet; train it with `embodrl train`"
            )
        self.remote = RemoteState()  # before the runner's constructor, whose restore fills it
        self.episodes: list[dict[str, float]] = []  # the actors' episode summaries since the last iteration
        super().__init__(cfg, run_dir, resume)
        # reward.model: the classifier (the runner's env has it) labels what arrives, never the actor
        self.judge = self.env.judge if isinstance(self.env, LearnedRewardVecEnv) else None
        judged = self.judge.classifier.spec.obs_keys if self.judge is not None else ()
        self.sent_keys = tuple(dict.fromkeys((*self.keys, *judged)))  # what actors send: raw observations
        self.updates_per_iteration = self.steps_per_iteration * self.env.num_envs
        transition_log = TransitionLog(run_dir / LOG_DIR, self.remote.first_segment)
        last_seq, received = dict(self.remote.last_seq), self.remote.received
        for record in transition_log.records():  # acknowledged after the last checkpoint
            batch = unpackb(record)
            if batch["seq"] > last_seq.get(batch["actor"], -1):
                self._take(Arrival(batch["transitions"], batch["env_steps"], batch.get("episodes")))
                last_seq[batch["actor"]] = batch["seq"]
        if self.remote.received > received:
            log.info(
                "replayed %d transitions from the log that the checkpoint does not hold",
                self.remote.received - received,
            )
        self.intake = Intake(transition_log, last_seq, server_cfg.max_pending_batches)
        self.server = LearnerServer(server_cfg, self.intake, self.policy_spec(), uuid.uuid4().hex[:8])
        if self.iteration:
            self._publish(self.iteration)

    def policy_spec(self) -> dict:
        """What an actor builds its copy of the policy from (a checkpoint's config.json), and the keys the
        transitions carry (`read_keys`: the policy's, and the reward model's) with their shapes."""
        shapes = {key: list(shape) for key, shape in self.policy.obs_shapes.items()}
        for key in self.sent_keys:
            shapes.setdefault(key, list(self.env.observation_spec[key].shape))
        return {
            "family": self.policy.family,
            "policy": self.policy.cfg.to_dict(),
            "obs_shapes": shapes,
            "read_keys": list(self.sent_keys),
        }

    def learn(self) -> dict:
        with self.server:
            try:
                final = super().learn()
            finally:
                self.intake.close()
            self.server.stop(finished=True)  # all iterations done: the actors stop too
            return final

    @property
    def takes_interventions(self) -> bool:
        """Always: any actor may send steps that a human drove (flagged `intervention`)."""
        return True

    def _take(self, arrival: Arrival) -> None:
        """A stored batch into the buffers: the reward model's labels, cameras as the policy's frozen
        features (as the local runner stores them), interventions into the demos too."""
        transitions = to_tensors(arrival.transitions, self.cfg.device)
        driven = transitions.pop("intervention", None)  # the flagged steps join the demos too
        count = transitions["reward"].shape[0]
        batch = TensorDict(transitions, batch_size=[count], device=self.cfg.device)
        if self.judge is not None:
            batch = self.judge.relabel_transitions(batch)
        for key in ("obs", "next_obs"):
            batch[key] = self.algo.stored_obs(batch[key])
        self._store(batch, driven)
        self.remote.received += count
        self.env_steps += arrival.env_steps
        if arrival.episodes is not None:
            self.episodes.append(arrival.episodes)

    def _take_arrivals(self, wait_s: float = 0.0) -> None:
        for arrival in self.intake.take(wait_s):
            self._take(arrival)

    def _publish(self, version: int) -> None:
        self.server.publish(version, to_arrays(self.policy.state_dict()))

    def _iterate(self) -> dict[str, float]:
        start = time.perf_counter()
        learning_starts = self.cfg.algo.learning_starts
        updates: list[dict[str, float]] = []
        waited = 0.0
        for _ in range(self.updates_per_iteration):
            self._take_arrivals()
            while self.remote.updates >= self.remote.received - learning_starts:  # every update earned
                t0 = time.perf_counter()
                self._take_arrivals(WAIT_SLICE_S)
                waited += time.perf_counter() - t0
            updates.append(self.algo.update(self.sample, self.generators["replay"]))
            self.remote.updates += 1
        self._publish(self.iteration + 1)  # the iteration learn() is about to count
        elapsed = time.perf_counter() - start
        self.wall_time += elapsed
        metrics = {f"train/{k}": sum(u[k] for u in updates) / len(updates) for k in updates[0]}
        metrics.update(self._episode_metrics())
        if self.judge is not None:  # how often the classifier disagrees with the actors' own labels
            metrics.update(self.judge.pop_metrics())
        metrics.update(
            {
                "rollout/env_steps": float(self.env_steps),
                "remote/transitions": float(self.remote.received),
                "remote/updates": float(self.remote.updates),
                "remote/wait_s": waited,
                "replay/size": float(len(self.buffer)),
                "replay/demo_size": float(len(self.demos)),
                "time/wall": self.wall_time,
            }
        )
        return metrics

    def _episode_metrics(self) -> dict[str, float]:
        """rollout/episodes and the means (return, length, success, the env's flags) over the episodes the
        actors finished in the batches taken since the last call; nothing when none finished."""
        summaries, self.episodes = self.episodes, []
        metrics = {"rollout/episodes": float(sum(s["episodes"] for s in summaries))}
        for name in dict.fromkeys(k for s in summaries for k in s if k != "episodes"):
            having = [s for s in summaries if name in s]
            count = sum(s["episodes"] for s in having)
            metrics[f"rollout/{name}"] = sum(s[name] * s["episodes"] for s in having) / count
        return metrics if summaries else {}

    def save(self) -> Path:
        """checkpoints/last with every batch stored so far in its buffer; then drop the log before it."""
        arrivals, segment, last_seq = self.intake.rotate()
        for arrival in arrivals:
            self._take(arrival)
        self.remote.first_segment, self.remote.last_seq = segment, last_seq
        path = super().save()
        self.intake.log.forget_before(segment)
        return path

    def save_last(
        self, policy: nn.Module, state: dict, generators: dict[str, torch.Generator], number: int
    ) -> Path:
        return super().save_last(policy, {**state, "remote": asdict(self.remote)}, generators, number)

    def restore_last(
        self, policy: nn.Module, generators: dict[str, torch.Generator], load_weights=None
    ) -> dict:
        state = super().restore_last(policy, generators, load_weights)
        self.remote = RemoteState(**state["remote"])
        return state
