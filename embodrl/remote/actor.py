"""`embodrl actor`: a simulated actor that plays a VecEnv with the learner's newest weights.

It builds its copy of the policy from the spec the learner sends on connect (a checkpoint's config, no
pickle), acts uniformly at random while it holds weights version 0 (the learner's `learning_starts`),
and streams transitions to the learner in batches of `batch_steps` decisions x env.num_envs, each with
the mean outcomes of the episodes that ended in it; new weights are loaded between steps. The network
lives in LearnerClient's thread: a learner that goes away only delays acknowledgements. Imports neither
the learner nor any algorithm.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from embodrl.choices import check_positive
from embodrl.data.replay_buffer import step_transitions
from embodrl.engine.episode_tracker import EpisodeTracker
from embodrl.errors import UserError
from embodrl.policies.base import Policy
from embodrl.policies.config import PolicyConfig
from embodrl.policies.registry import policy_class
from embodrl.remote.arrays import to_arrays, to_tensors
from embodrl.remote.client import LearnerClient
from embodrl.remote.config import ActorConnectionConfig
from embodrl.sims.base import StepResult, VecEnv
from embodrl.sims.config import EnvConfig
from embodrl.sims.interventions import ScriptedIntervener, TakeoverRule
from embodrl.sims.registry import make_env

logger = logging.getLogger(__name__)


@dataclass
class ActorStats:
    decisions: int = 0  # transitions played (env.num_envs per step)
    env_steps: int = 0
    episodes: int = 0
    version: int = 0  # of the weights acting


def actor_seed(seed: int, actor_id: str) -> int:
    """The experiment's seed made the actor's own: actors of one experiment explore differently."""
    return (seed + zlib.crc32(actor_id.encode())) % 2**31


def policy_from_spec(spec: dict, device: str = "cpu") -> Policy:
    """A policy built from the learner's spec ({family, policy, obs_shapes}), with its initial weights."""
    shapes = {key: tuple(shape) for key, shape in spec["obs_shapes"].items()}
    return policy_class(spec["family"])(PolicyConfig.from_dict(spec["policy"]), shapes, device=device)


def check_env_fits(env: VecEnv, spec: dict) -> None:
    """A one-line error when the env observes or acts otherwise than the learner's policy expects."""
    for key in spec["read_keys"]:
        have = tuple(env.observation_spec[key].shape) if key in env.observation_spec else None
        if have != tuple(spec["obs_shapes"][key]):
            raise UserError(
                f"this actor's env gives {key} shaped {have}, the learner's policy reads "
                f"{spec['obs_shapes'][key]}: run the actor with the learner's experiment"
            )
    if env.action_spec.dim != spec["policy"]["action_dim"]:
        raise UserError(
            f"this actor's env takes {env.action_spec.dim} action dims, the learner's policy gives "
            f"{spec['policy']['action_dim']}: run the actor with the learner's experiment"
        )


def transition(
    obs: TensorDict, actions: torch.Tensor, result: StepResult, keys: tuple[str, ...]
) -> TensorDict:
    """One decision of each env as the replay buffer keeps it (data/replay_buffer.py)."""
    next_obs = result.final_obs.select(*keys)  # the finished episode's last on auto-reset
    return step_transitions(obs.select(*keys), actions, result.reward, next_obs, result.terminated)


class PolicyCopy:
    """The learner's policy as an actor holds it: built from the spec the learner sent, its weights replaced
    by each newer version the client received (`refresh`, between decisions)."""

    def __init__(self, client: LearnerClient, device: str = "cpu") -> None:
        self.client = client
        self.policy = policy_from_spec(client.policy_spec, device)
        self.version = 0  # of the weights acting; 0: none yet (act uniformly at random)

    def refresh(self) -> None:
        weights = self.client.take_weights()
        if weights is not None:
            version, state = weights
            self.policy.load_state_dict(to_tensors(state, self.policy.device))
            self.version = version


class TransitionBatches:
    """An actor's transitions on their way to the learner: collected, then sent as one acknowledged batch."""

    def __init__(self, client: LearnerClient) -> None:
        self.client = client
        self.pending: list[TensorDict] = []

    def add(self, transitions: TensorDict) -> int:
        """Collect transitions [B]; returns how many collections are pending."""
        self.pending.append(transitions)
        return len(self.pending)

    def send(self, env_steps: int, episodes: dict[str, float] | None = None, wait: bool = True) -> bool:
        """Send what is pending with the env steps it took and the outcomes of the episodes that ended in it
        (the learner logs them); whether it was queued (see LearnerClient.submit's `wait`)."""
        transitions, self.pending = torch.cat(self.pending), []
        has_episodes = episodes is not None and episodes["episodes"]
        seq = self.client.submit(
            to_arrays(transitions), env_steps, episodes=episodes if has_episodes else None, wait=wait
        )
        return seq is not None

    def send_rest(self, env_steps: int, episodes: dict[str, float] | None = None) -> None:
        """Stopping: send what is pending unless the outbox is full (the learner away): never waits."""
        sendable = self.client.error is None and not self.client.finished
        if self.pending and sendable and not self.send(env_steps, episodes, wait=False):
            logger.warning("the outbox is full: the last %d decisions are not sent", len(self.pending))
        self.pending = []


def status_line(client: LearnerClient, stats: ActorStats) -> str:
    """An actor's status: what it played and how far the learner acknowledged it."""
    acked = client.stats
    link = (
        "learner finished"
        if client.finished
        else "closed"
        if client.closed
        else "connected"
        if client.connected
        else "learner away"
    )
    return (
        f"actor {client.cfg.actor_id}: {stats.decisions} transitions, {stats.episodes} episodes, "
        f"weights v{stats.version}; acked up to batch {acked.last_acked_seq} ({acked.acked_transitions} "
        f"transitions), {client.unacked} unacked, {acked.dropped} dropped, {acked.reconnects} reconnects; "
        f"{link}"
    )


class SimActor:
    """Plays `env` with the learner's weights, streaming transitions through `client`."""

    def __init__(
        self,
        env: VecEnv,
        client: LearnerClient,
        batch_steps: int,
        seed: int = 0,
        device: str = "cpu",
        intervention: TakeoverRule | None = None,
    ) -> None:
        """`intervention`: when the env's scripted expert takes over (the experiment's `intervention.*` with
        mode=expert; None: never)."""
        check_positive("--batch-steps", batch_steps)
        check_env_fits(env, client.policy_spec)
        self.env, self.client, self.batch_steps = env, client, batch_steps
        self.copy = PolicyCopy(client, device)
        self.policy = self.copy.policy
        self.intervener = (
            None
            if intervention is None
            else ScriptedIntervener(intervention, env.num_envs, self.policy.cfg.chunk_size)
        )
        self.keys = tuple(client.policy_spec["read_keys"])
        self.seed = actor_seed(seed, client.cfg.actor_id)
        self.generator = torch.Generator().manual_seed(self.seed)  # the uniform actions before weights
        self.stats = ActorStats()
        self.episodes = EpisodeTracker.zeros(env.num_envs)  # episodes run on across batches
        self.batches = TransitionBatches(client)
        self.results: list[StepResult] = []  # the pending batch's steps

    def _actions(self, obs: TensorDict) -> torch.Tensor:
        if self.copy.version:
            with torch.no_grad():
                return self.policy.act(obs).actions
        spec = self.env.action_spec  # no weights yet: uniform over the env's bounds, as the local runner
        shape = (self.env.num_envs, *self.policy.chunk_shape)
        uniform = torch.rand(shape, generator=self.generator).to(self.policy.device)
        return spec.low + (spec.high - spec.low) * uniform

    def run(self, decisions: int = 0, status_every_s: float = 10.0) -> ActorStats:
        """Act until `decisions` transitions are played (0: until interrupted) or the learner finished its
        run; the last partial batch is sent too. Prints a status line every `status_every_s`."""
        torch.manual_seed(self.seed)  # the policy's samples
        obs = self.env.reset(seed=self.seed)
        next_status = time.monotonic() + status_every_s
        try:
            while (not decisions or self.stats.decisions < decisions) and not self.client.finished:
                self.copy.refresh()
                self.stats.version = self.copy.version
                actions = self._actions(obs)
                driven = None
                if self.intervener is not None:  # the expert drives the envs whose policy strayed
                    self.intervener.trust(self.stats.env_steps)
                    actions, driven = self.intervener.choose(actions, self.env)
                result = self.env.step(actions)
                step = transition(obs, actions, result, self.keys)
                if self.intervener is not None:  # flagged: the learner keeps them as demos too
                    step["intervention"] = driven
                    self.intervener.end_episodes(result.done)
                self.results.append(result)
                self.stats.decisions += self.env.num_envs
                self.stats.env_steps += int(result.steps_executed.sum())
                self.stats.episodes += int(result.done.sum())
                if self.batches.add(step) == self.batch_steps:
                    self.batches.send(*self._outcomes())
                obs = result.obs
                if time.monotonic() >= next_status:
                    print(self.status(), flush=True)
                    next_status = time.monotonic() + status_every_s
        finally:
            if self.results:
                self.batches.send_rest(*self._outcomes())
        return self.stats

    def _outcomes(self) -> tuple[int, dict[str, float]]:
        """The pending steps' env steps and the outcomes of the episodes that ended in them."""
        results, self.results = self.results, []
        steps = torch.stack([r.steps_executed for r in results])
        self.episodes.record_rollout(
            torch.stack([r.reward for r in results]),
            steps,
            torch.stack([r.done for r in results]),
            torch.stack([r.success for r in results]),
        )
        outcomes = self.episodes.pop()
        if self.intervener is not None and outcomes["episodes"]:  # the share the expert drove, since the last
            metrics = self.intervener.pop_metrics(outcomes["episodes"])
            outcomes.update({name.removeprefix("rollout/"): value for name, value in metrics.items()})
        return int(steps.sum()), outcomes

    def status(self) -> str:
        return status_line(self.client, self.stats)


@contextmanager
def learner_connection(conn: ActorConnectionConfig, flush_s: float) -> Iterator[LearnerClient]:
    """A connected client; on leaving, wait up to `flush_s` for the unacknowledged batches, then raise what
    stopped the connection, if anything did."""
    with LearnerClient(conn) as client:
        try:
            yield client
        finally:
            if not client.flush(flush_s) and not client.finished:
                logger.warning("leaving %d batches unacknowledged (the learner is away)", client.unacked)
        if client.error is not None:
            raise client.error


def run_actor(
    env_cfg: EnvConfig,
    conn: ActorConnectionConfig,
    batch_steps: int,
    decisions: int = 0,
    seed: int = 0,
    status_every_s: float = 10.0,
    flush_s: float = 10.0,
    device: str = "cpu",
    intervention: TakeoverRule | None = None,
) -> tuple[ActorStats, str]:
    """Connect, act, and before leaving wait up to `flush_s` for the unacknowledged batches; returns the
    stats and the last status line."""
    with learner_connection(conn, flush_s) as client, make_env(env_cfg, device=device) as env:
        actor = SimActor(env, client, batch_steps, seed, device, intervention)
        actor.run(decisions, status_every_s)
    return actor.stats, actor.status()
