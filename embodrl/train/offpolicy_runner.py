"""`embodrl train` for algorithms that learn from a replay buffer (AlgoConfig.on_policy false).

Each iteration plays one episode's worth of decisions (train.rollout_steps, or ceil(max_episode_steps /
chunk)) from fresh initial states, as the on-policy runner does: every transition enters the replay
buffer, and after `algo.learning_starts` env steps of uniform random actions each transition earns one
`update` of the algorithm (its `algo.utd` critic steps). An iteration starting from reset_to is what
makes --resume exact: the checkpoint at an iteration's end holds the weights, the optimizers, the RNG
states and the whole replay buffer, and no env state is left to restore.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from tensordict import TensorDict
from torch import nn

from embodrl.algos import registry
from embodrl.config import ExperimentConfig
from embodrl.data.replay_buffer import ReplayBuffer, demo_transitions, mixed_batch, step_transitions
from embodrl.engine.episode_tracker import EpisodeTracker
from embodrl.errors import ConfigError, UserError
from embodrl.parallel.distributed import launched_by_torchrun
from embodrl.sims.base import StepResult
from embodrl.sims.interventions import ScriptedIntervener
from embodrl.sims.registry import make_env
from embodrl.train.best import BestCheckpoint
from embodrl.train.episodes import EpisodeResults
from embodrl.train.evaluation import eval_metrics
from embodrl.train.learned_reward_env import LearnedRewardVecEnv, learned_reward_vecenv
from embodrl.train.logger import plot_learning_curve
from embodrl.train.noise_action_env import steer_noise
from embodrl.train.policy_setup import build_policy
from embodrl.train.runner import Runner, warn_unsaved
from embodrl.train.stopping import StopAtIterationEnd


class OffPolicyRunner(Runner):
    """Trains a policy with the off-policy algorithm `algo.name` in one VecEnv (one process)."""

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, resume: bool = False) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        if launched_by_torchrun():
            raise UserError(
                f"algo.name={cfg.algo.name} learns in one process from its replay buffer; run it without "
                "torchrun (raise algo.utd for more updates per env step)"
            )
        if cfg.intervention.mode != "none" and cfg.algo.noise_policy:
            raise UserError(
                f"intervention.mode={cfg.intervention.mode} executes the expert's env actions, which "
                "algo.noise_policy's actor (acting in noise space) cannot store: drop one of them"
            )
        if cfg.train.torch_threads:
            torch.set_num_threads(cfg.train.torch_threads)
        torch.manual_seed(cfg.seed)
        if cfg.reward.model:  # the learner sees the classifier's reward and success, not the simulator's
            self.env = learned_reward_vecenv(cfg.reward, cfg.env, device=cfg.device)
        else:
            self.env = make_env(cfg.env, device=cfg.device)
        if cfg.algo.noise_policy:  # DSRL: the actor picks a frozen policy's initial noise
            cfg, self.env = steer_noise(cfg, self.env)
            self.cfg = cfg
        self.policy = build_policy(cfg, self.env)
        if cfg.algo.noise_policy:
            self.env.prepare_actor(self.policy)
        decoder = self.env if cfg.algo.noise_policy else None  # the wrapper that decodes the actor's noise
        self.algo = registry.get("off_policy", cfg.algo.name)(self.policy, cfg.algo, decoder=decoder)
        self.keys = self.policy.cfg.read_keys  # the observation keys the learner reads
        self.buffer = ReplayBuffer(cfg.algo.buffer_size)
        self.intervener = (
            ScriptedIntervener(cfg.intervention, self.env.num_envs, self.policy.cfg.chunk_size)
            if cfg.intervention.mode != "none"
            else None
        )
        self.demos = self._demo_buffer()
        self.steps_per_iteration = cfg.train.rollout_steps or math.ceil(
            cfg.env.max_episode_steps / self.policy.cfg.chunk_size
        )
        self.generators = {
            "replay": torch.Generator().manual_seed(cfg.seed),
            "init_states": torch.Generator().manual_seed(cfg.seed + 1),
        }
        self.iteration, self.env_steps, self.wall_time = 0, 0, 0.0
        self.best = BestCheckpoint(run_dir) if cfg.train.keep_best else None
        if resume and self.resumable():
            self._restore()

    @property
    def takes_interventions(self) -> bool:
        """Whether decisions that the scripted expert (or a human) drove join the demo buffer."""
        return self.intervener is not None

    def _demo_buffer(self) -> ReplayBuffer | None:
        """The demonstrations of `algo.demo_dataset`, held apart so every batch draws its share from them;
        with interventions also the takeover decisions (room for as many as the online buffer)."""
        root, algo = self.cfg.algo.demo_dataset, self.cfg.algo
        if not root and not self.takes_interventions:
            return None
        if root and self.policy.cfg.chunk_size != 1:
            raise ConfigError(
                f"algo.demo_dataset holds single actions; policy.chunk_size={self.policy.cfg.chunk_size} "
                "would need chunks: set policy.chunk_size=1"
            )
        transitions = (
            demo_transitions(root, self.keys, algo.demo_episodes, self.policy.frozen_features)
            if root
            else None
        )
        if transitions is not None and not transitions.batch_size[0]:
            raise UserError(f"algo.demo_dataset={root} gives no transitions (no frames, or none flagged)")
        frames = 0 if transitions is None else transitions.batch_size[0]
        demos = ReplayBuffer(frames + (algo.buffer_size if self.takes_interventions else 0))
        if transitions is not None:
            demos.add(transitions.to(self.cfg.device))
        return demos

    def _store(self, transitions: TensorDict, driven: torch.Tensor | None = None) -> None:
        """Transitions [B] into the replay buffer, and those that the expert or a human drove (`driven` [B]
        bool) into the demos too: HG-DAgger / HIL-SERL, the takeovers are demonstrations."""
        self.buffer.add(transitions)
        if driven is not None and driven.any():
            self.demos.add(transitions[driven])

    def sample(self) -> TensorDict:
        """One batch: `algo.demo_ratio` of it from the demos (when there are any), the rest online."""
        algo = self.cfg.algo
        return mixed_batch(
            self.buffer, self.demos, algo.batch_size, algo.demo_ratio, self.generators["replay"]
        )

    def learn(self) -> dict:
        """Train to train.iterations; returns the final evaluation."""
        cfg = self.cfg
        logger = self.open_logger("rl", cfg.train.iterations, self.iteration)
        consistent = True  # False inside an iteration: a checkpoint then would hold half of it
        with StopAtIterationEnd("iteration") as stop:
            try:
                while self.iteration < cfg.train.iterations:
                    consistent = False
                    metrics = self._iterate()
                    self.iteration += 1
                    if cfg.train.eval_every and self.iteration % cfg.train.eval_every == 0:
                        metrics.update(self.evaluate())
                        if self.best is not None:
                            self.best.consider(self.iteration, metrics, self.policy)
                    logger.log(self.iteration, metrics)
                    if self.iteration % cfg.train.save_every == 0:
                        self.save()
                    consistent = True
                    if stop.requested():  # Ctrl-C or SIGTERM during the iteration: stop before the next one
                        raise stop.interruption()
            finally:  # nothing lost on a crash, Ctrl-C or SIGTERM: the last finished iteration is saved
                logger.close()
                if consistent:
                    self.save()
                else:
                    warn_unsaved(self.run_dir, "iteration", self.iteration + 1)
                plot_learning_curve(self.run_dir)
        try:
            final = self.evaluate(record=cfg.train.videos, video_dir=self.run_dir / "videos")
            return self.conclude(final, self.iteration, final, self.policy, cfg.train.eval_episodes)
        finally:
            self.env.close()

    def _random_actions(self) -> torch.Tensor:
        """Uniform action chunks [N, C, A] over the env's bounds (torch's RNG, saved in checkpoints)."""
        spec = self.env.action_spec
        shape = (self.env.num_envs, *self.policy.chunk_shape)
        return spec.low + (spec.high - spec.low) * torch.rand(shape, device=self.cfg.device)

    def _iterate(self) -> dict[str, float]:
        start = time.perf_counter()
        env, algo_cfg = self.env, self.cfg.algo
        state_ids = torch.randint(
            env.num_init_states, (env.num_envs,), generator=self.generators["init_states"]
        )
        obs = env.reset_to(state_ids)
        if self.intervener is not None:  # fresh episodes: the policy drives (and resume stays exact)
            self.intervener.end_episodes(torch.ones(env.num_envs, dtype=torch.bool))
            patience = self.intervener.trust(self.env_steps)
        stored = self.algo.stored_obs(obs)  # what the buffer keeps: cameras as frozen features
        tracker = EpisodeTracker.zeros(env.num_envs, episode_limit=self.cfg.env.max_episode_steps)
        record: dict[str, list[torch.Tensor]] = {"reward": [], "steps": [], "done": [], "success": []}
        updates: list[dict[str, float]] = []
        t_update = 0.0
        for _ in range(self.steps_per_iteration):
            learning = self.env_steps >= algo_cfg.learning_starts
            actions = self.policy.act(obs).actions if learning else self._random_actions()
            driven = None
            if self.intervener is not None:  # the expert drives the envs whose policy strayed
                actions, driven = self.intervener.choose(actions, env)
            result = env.step(actions)
            stored_next = self.algo.stored_obs(result.final_obs)  # the finished episode's last
            transitions = step_transitions(stored, actions, result.reward, stored_next, result.terminated)
            self._store(self.algo.stored_transitions(transitions), driven)
            if self.intervener is not None:
                self.intervener.end_episodes(result.done)
            self.env_steps += int(result.steps_executed.sum())
            obs = result.obs
            stored = self._stored_next_decision(result, stored_next)
            for key, value in zip(
                record, (result.reward, result.steps_executed, result.done, result.success), strict=True
            ):
                record[key].append(value)
            if learning:
                t0 = time.perf_counter()
                updates += [
                    self.algo.update(self.sample, self.generators["replay"]) for _ in range(env.num_envs)
                ]
                t_update += time.perf_counter() - t0
        tracker.record_rollout(*(torch.stack(values) for values in record.values()))
        elapsed = time.perf_counter() - start
        self.wall_time += elapsed
        metrics = {f"train/{k}": sum(u[k] for u in updates) / len(updates) for k in (updates or [{}])[0]}
        outcomes = tracker.pop()
        metrics.update({f"rollout/{k}": v for k, v in outcomes.items()})
        if self.intervener is not None:
            metrics.update(self.intervener.pop_metrics(outcomes["episodes"]))
            metrics["rollout/intervention_patience"] = float(patience)
        if self.takes_interventions:
            metrics["replay/demo_size"] = float(len(self.demos))
        if isinstance(env, LearnedRewardVecEnv):  # the classifier's errors, for diagnosis only
            metrics.update(env.pop_metrics())
        metrics.update(
            {
                "rollout/env_steps": float(self.env_steps),
                "rollout/env_steps_per_s": self.steps_per_iteration * env.num_envs / max(elapsed, 1e-9),
                "replay/size": float(len(self.buffer)),
                "time/update": t_update,
                "time/wall": self.wall_time,
            }
        )
        return metrics

    def _stored_next_decision(self, result: StepResult, stored_next: TensorDict) -> TensorDict:
        """The stored form of the observations the next decision starts from: `stored_next` where the episode
        goes on, the frozen features computed only for the envs that restarted (not for all N)."""
        restarted = result.done.nonzero().flatten()
        if not len(restarted):
            return stored_next
        stored = stored_next.clone()
        stored[restarted] = self.algo.stored_obs(result.obs[restarted])
        return stored

    def evaluate(self, record: int = 0, video_dir: Path | None = None) -> dict[str, float]:
        """Deterministic policy on a fixed set of initial states (ids 0..eval_episodes-1)."""
        return eval_metrics(self.play_from(self.policy, record=record, video_dir=video_dir))

    def play_from(
        self, policy: nn.Module, first_state_id: int = 0, record: int = 0, video_dir: Path | None = None
    ) -> EpisodeResults:
        """`policy`'s evaluation episodes from initial state `first_state_id` on (every iteration starts from
        reset_to, so they may use the training env)."""
        # a learned reward's env counts the classifier's success: evaluations count the simulator's
        return self.play_rl_evaluation(
            policy, first_state_id, record, video_dir, own_env=bool(self.cfg.reward.model)
        )

    def save(self) -> Path:
        """Write checkpoints/last: the policy, the algorithm's state and the replay buffer, at once."""
        state = {
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "wall_time": self.wall_time,
            "algo": self.algo.state_dict(),
            "replay": self.buffer.state_dict(),
        }
        if self.takes_interventions:  # the demo buffer grew by the takeovers
            state["demos"] = self.demos.state_dict()
        return self.save_last(self.policy, state, self.generators, self.iteration)

    def _restore(self) -> None:
        state = self.restore_last(self.policy, self.generators)
        self.algo.load_state_dict(state["algo"])
        self.buffer.load_state_dict(state["replay"])
        if self.takes_interventions and "demos" in state:  # (a learner saved before it took them: none)
            self.demos.load_state_dict(state["demos"])
        self.iteration, self.env_steps, self.wall_time = (
            state["iteration"],
            state["env_steps"],
            state["wall_time"],
        )
