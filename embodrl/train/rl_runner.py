"""`embodrl train`: the on-policy loop. collect -> advantages -> update -> log -> eval -> checkpoint."""

from __future__ import annotations

import dataclasses
import math
import time
from contextlib import nullcontext
from functools import partial
from pathlib import Path

import torch
from torch import nn

from embodrl.algos.ppo import PPO
from embodrl.config import ExperimentConfig
from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.engine.env_client import StagedEnv
from embodrl.engine.episode_tracker import mean_over_ranks
from embodrl.engine.faults import collect_with_retries
from embodrl.engine.schedules import make_schedule
from embodrl.errors import ConfigError, UserError
from embodrl.parallel.data_parallel import DataParallel
from embodrl.parallel.distributed import from_main, init_from_env, is_main, rank, rank_seed, sum_over_ranks
from embodrl.parallel.full_state import UnshardedCopy, load_full_optimizer_state, load_full_weights
from embodrl.parallel.offload import PhaseOffload
from embodrl.train.best import BestCheckpoint
from embodrl.train.episodes import EpisodeResults
from embodrl.train.evaluation import eval_metrics
from embodrl.train.learned_reward_env import LearnedRewardEnv, learned_reward_env
from embodrl.train.logger import plot_learning_curve
from embodrl.train.memory import estimate_policy_memory
from embodrl.train.policy_setup import build_policy
from embodrl.train.runner import Runner, warn_unsaved
from embodrl.train.stopping import StopAtIterationEnd


class OnPolicyRunner(Runner):
    """Trains a policy with the on-policy algorithm `algo.name` in one VecEnv; episodes start from reset_to,
    and with fixed windows (train.rollout_steps > 0) they carry over from one iteration to the next when
    the algorithm allows it (AlgoConfig.carries_episodes_over).

    Under torchrun (WORLD_SIZE > 1) every rank runs one: each steps env.num_envs envs of its own with
    rank-dependent seeds, the update averages gradients over ranks (engine.data_parallel), and rank 0
    alone logs, evaluates and writes checkpoints, videos and the learning curve. With fsdp the ranks
    act in lockstep (every forward all-gathers), and before an evaluation or a checkpoint every rank
    joins the gather of the whole state into rank 0's unsharded copy (parallel/full_state.py).
    """

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, resume: bool = False) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        if cfg.train.torch_threads:
            torch.set_num_threads(cfg.train.torch_threads)
        distributed = init_from_env(cfg.device)
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        # rank r's envs are the global envs r * N .. r * N + N - 1, seeded as such
        env_cfg = dataclasses.replace(cfg.env, seed=cfg.env.seed + rank() * cfg.env.num_envs)
        if cfg.reward.model:  # the learner sees the classifier's reward and success, not the simulator's
            self.env = learned_reward_env(cfg.reward, env_cfg, cfg.engine, device=cfg.device)
        else:
            self.env = StagedEnv(env_cfg, cfg.engine, device=cfg.device)
        self.policy = build_policy(cfg, self.env)
        sharded = distributed and cfg.engine.data_parallel == "fsdp"
        if sharded and cfg.algo.kl_coef > 0:
            raise UserError(
                "algo.kl_coef > 0 keeps a whole reference copy of the policy on every rank, which "
                "engine.data_parallel=fsdp avoids: set algo.kl_coef=0 or engine.data_parallel=ddp"
            )
        self.unsharded = UnshardedCopy(self.policy) if sharded else None  # taken before sharding
        # Fixed-length windows (train.rollout_steps > 0) carry episodes across iterations when the
        # algorithm allows it; episode-sized rollouts start every iteration from fresh states.
        continue_episodes = cfg.train.rollout_steps > 0 and cfg.algo.carries_episodes_over
        self.algo = PPO(
            self.policy,
            cfg.algo,
            bf16=cfg.train.precision == "bf16",
            total_iterations=cfg.train.iterations,
            continue_episodes=continue_episodes,
            data_parallel=(
                DataParallel(self.policy, cfg.engine.data_parallel, shared_rollout=False)
                if distributed
                else None
            ),
        )
        # Before the first rollout, so a user sees whether the job fits before it starts.
        memory = estimate_policy_memory(self.policy, cfg.algo.minibatch_size, cfg.train.precision)
        if is_main():
            print(memory.report(), flush=True)
        chunk = self.policy.cfg.chunk_size
        steps = cfg.train.rollout_steps or math.ceil(cfg.env.max_episode_steps / chunk)
        self.buffer = RolloutBuffer(steps, self.env.num_envs, device=cfg.device)
        self.schedule = make_schedule(
            cfg.engine, self.env, self.policy, self.buffer, cfg.device, continue_episodes
        )
        if cfg.engine.offload and distributed and not self.schedule.inference.shared:
            raise ConfigError(
                "engine.offload=true with engine.placement=disaggregated would move the weights that "
                "DistributedDataParallel holds; under torchrun use engine.placement=colocated (the "
                "optimizer state still offloads)"
            )
        inference_copy = None if self.schedule.inference.shared else self.schedule.inference.policy
        self.offload = (
            PhaseOffload(self.policy, self.algo.optimizer, inference_copy) if cfg.engine.offload else None
        )
        self.generators = {
            "minibatch": torch.Generator().manual_seed(cfg.seed),
            "init_states": torch.Generator().manual_seed(cfg.seed + 1),
        }
        cfg.algo.check_num_envs(self.env.num_envs)
        self.iteration, self.env_steps, self.wall_time, self.env_restarts = 0, 0, 0.0, 0
        self.best = BestCheckpoint(run_dir) if cfg.train.keep_best else None
        if resume and self.resumable():
            self._restore()  # every rank loads the same checkpoint
        if rank() > 0:  # own action noise and initial states; rank 0 keeps the single-process streams
            seed = rank_seed(cfg.seed + self.iteration)  # + iteration: a resumed rank does not replay them
            torch.manual_seed(seed)
            self.generators["init_states"].manual_seed(seed + 1)
        self.schedule.push_weights(self.policy, self.iteration)  # weight version = updates done

    def _initial_states(self) -> torch.Tensor:
        """State ids for this iteration's episodes: each run of `algo.envs_per_initial_state` consecutive
        envs shares one."""
        share = self.cfg.algo.envs_per_initial_state
        ids = torch.randint(
            self.env.num_init_states, (self.env.num_envs // share,), generator=self.generators["init_states"]
        )
        return ids.repeat_interleave(share)

    def learn(self) -> dict:
        """Train to train.iterations; returns the final evaluation (rank 0's, on every rank)."""
        cfg = self.cfg
        logger = self.open_logger("rl", cfg.train.iterations, self.iteration) if is_main() else None
        consistent = True  # False inside an iteration: a checkpoint then would hold half of it
        with StopAtIterationEnd("iteration") as stop:
            try:
                while self.iteration < cfg.train.iterations:
                    consistent = False
                    metrics = self._iterate()
                    self.iteration += 1
                    evaluating = bool(cfg.train.eval_every) and self.iteration % cfg.train.eval_every == 0
                    saving = self.iteration % cfg.train.save_every == 0
                    if evaluating or saving:
                        self._gather_full_state()
                    if logger is not None:  # rank 0; the other ranks only collect and train
                        if evaluating:
                            metrics.update(self.evaluate(record=0))
                            if self.best is not None:
                                self.best.consider(self.iteration, metrics, self._full_policy())
                        logger.log(self.iteration, metrics)
                        if saving:
                            self.save()
                    consistent = True
                    if stop.requested():  # Ctrl-C or SIGTERM during the iteration: stop before the next one
                        self._gather_full_state()  # fsdp: for the checkpoint that `finally` writes
                        raise stop.interruption()
                    # Only now may an async producer at max_staleness=0 start the next rollout: it then never
                    # draws from torch's RNG beside the evaluation, and a checkpoint holds the RNG state the
                    # next rollout starts from (the synchronous run, and its exact resume).
                    self.schedule.push_weights(self.policy, self.iteration)
                self._gather_full_state()  # for the last checkpoint and the final evaluation
            finally:  # nothing lost on a crash, Ctrl-C or SIGTERM: the last finished iteration is saved
                self.schedule.close()
                if logger is not None:
                    logger.close()
                    if consistent:
                        self.save()
                    else:  # a second signal or a crash inside an iteration: the last checkpoint stays
                        warn_unsaved(self.run_dir, "iteration", self.iteration + 1)
                    plot_learning_curve(self.run_dir)
        return from_main(self._final_evaluation)

    def _gather_full_state(self) -> None:
        """fsdp, on every rank: rank 0's unsharded copy takes this iteration's state (once per iteration)."""
        if self.unsharded is not None and self.unsharded.iteration != self.iteration:
            self.unsharded.gather(self.policy, self.algo.optimizer, self.iteration)

    def _full_policy(self) -> torch.nn.Module:
        """The whole policy: with fsdp, rank 0's unsharded copy (gathered before evaluations and saves)."""
        return self.policy if self.unsharded is None else self.unsharded.policy

    def _final_evaluation(self) -> dict[str, float]:
        final = self.evaluate(record=self.cfg.train.videos, video_dir=self.run_dir / "videos")
        return self.conclude(final, self.iteration, final, self._full_policy(), self.cfg.train.eval_episodes)

    def _iterate(self) -> dict[str, float]:
        start = time.perf_counter()
        with self.offload.rollout_phase() if self.offload else nullcontext():
            rollout, failures = collect_with_retries(
                self.schedule,
                self._initial_states,
                self.generators["init_states"],
                self.cfg.engine.max_retries,
            )
        t_collect = time.perf_counter()
        with self.offload.update_phase() if self.offload else nullcontext():
            update = self.algo.update(rollout.buffer, self.iteration, self.generators["minibatch"])
        t_update = time.perf_counter()
        steps = int(rollout.buffer.data["steps_executed"].sum())
        totals = sum_over_ranks({"steps": float(steps), "restarts": float(failures)})  # under torchrun
        self.env_steps += int(totals["steps"])
        self.env_restarts += int(totals["restarts"])
        self.wall_time += t_update - start
        metrics = {f"train/{k}": v for k, v in update.items()}
        metrics.update({f"rollout/{k}": v for k, v in mean_over_ranks(rollout.episodes).items()})
        metrics.update({f"time/{k}": v for k, v in rollout.timings.items()})
        metrics.update(
            {
                "time/update": t_update - t_collect,
                "rollout/env_steps": float(self.env_steps),
                # the rollout's own wall time: an async rollout was produced while the actor trained
                "rollout/env_steps_per_s": totals["steps"] / max(rollout.timings["rollout"], 1e-9),
                "time/wall": self.wall_time,
                "engine/env_restarts": float(self.env_restarts),
            }
        )
        if isinstance(self.env, LearnedRewardEnv):
            metrics.update(self.env.pop_metrics())
        if torch.device(self.cfg.device).type == "cuda":  # what a user sizes batches and envs by
            metrics["memory/cuda_peak_gib"] = torch.cuda.max_memory_allocated(self.cfg.device) / 2**30
        return metrics

    def evaluate(self, record: int = 0, video_dir: Path | None = None) -> dict[str, float]:
        """Deterministic policy on a fixed set of initial states (ids 0..eval_episodes-1); with fsdp, rank 0's
        unsharded copy, moved to the device for the evaluation."""
        policy = self._full_policy().to(self.cfg.device)
        try:
            return eval_metrics(self.play_from(policy, record=record, video_dir=video_dir))
        finally:
            if policy is not self.policy:
                policy.cpu()

    def play_from(
        self, policy: nn.Module, first_state_id: int = 0, record: int = 0, video_dir: Path | None = None
    ) -> EpisodeResults:
        """`policy`'s evaluation episodes from initial state `first_state_id` on; the first `record` as
        videos into `video_dir`."""
        # the async schedule's producer may be stepping self.env right now; a learned reward's env would
        # report the classifier's success: evaluations count the simulator's
        own_env = self.cfg.engine.schedule == "async" or isinstance(self.env, LearnedRewardEnv)
        # an async producer waits at its next decision meanwhile: the evaluation's seeded fork of torch's RNG
        # then neither sees its draws nor makes it replay them
        with self.schedule.paused():
            return self.play_rl_evaluation(policy, first_state_id, record, video_dir, own_env)

    def save(self) -> Path | None:
        """Write checkpoints/last (rank 0); None with fsdp when no gather has followed the last iteration."""
        policy, algo = self.policy, self.algo.state_dict()
        if self.unsharded is not None:
            if self.unsharded.iteration != self.iteration:  # a rank failed: no gather is possible now,
                return None  # and the last checkpoint stays
            policy, algo["optimizer"] = self.unsharded.policy, self.unsharded.optimizer_state
        state = {
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "wall_time": self.wall_time,
            "env_restarts": self.env_restarts,
            "algo": algo,
        }
        return self.save_last(policy, state, self.generators, self.iteration)

    def _restore(self) -> None:
        """Every rank loads the same checkpoint; with fsdp each keeps its shards of weights and optimizer."""
        load_weights = None if self.unsharded is None else partial(load_full_weights, self.policy)
        state = self.restore_last(self.policy, self.generators, load_weights)
        algo = state["algo"]
        if self.unsharded is not None:  # saved by parameter name: loaded here, the update restores the rest
            load_full_optimizer_state(self.policy, self.algo.optimizer, algo["optimizer"])
            algo = {**algo, "optimizer": self.algo.optimizer.state_dict()}
        self.algo.load_state_dict(algo)
        self.iteration, self.env_steps = state["iteration"], state["env_steps"]
        self.wall_time, self.env_restarts = state["wall_time"], state["env_restarts"]
