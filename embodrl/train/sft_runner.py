"""`embodrl sft`: behaviour cloning of any policy family from a LeRobotDataset v3 folder."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn
from torch.utils.data import DataLoader, Subset

from embodrl.config import ExperimentConfig
from embodrl.data.chunk_dataset import ActionChunkDataset, collate_chunks
from embodrl.data.dataset_inputs import dataset_inputs
from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.data.shuffled_batches import ShuffledBatches
from embodrl.errors import UserError
from embodrl.obs_keys import PRIVILEGED
from embodrl.parallel.distributed import launched_by_torchrun
from embodrl.sims.config import NO_SIMULATOR
from embodrl.sims.registry import make_env
from embodrl.train.best import BestCheckpoint
from embodrl.train.episodes import EpisodeResults
from embodrl.train.evaluation import eval_metrics, evaluate_policy, in_eval_mode, summarize
from embodrl.train.memory import estimate_policy_memory
from embodrl.train.policy_setup import PolicySpace, build_policy, build_policy_for
from embodrl.train.runner import Runner, warn_unsaved
from embodrl.train.simulated_demos import SimulatedDemos
from embodrl.train.stopping import StopAtIterationEnd
from embodrl.train.validation import held_out_episodes, validation_metrics

log = logging.getLogger(__name__)


def first_episodes_frames(dataset: LeRobotDataset, max_episodes: int) -> np.ndarray:
    """Frame indices of the dataset's first `max_episodes` episodes (all frames when 0)."""
    if max_episodes == 0 or max_episodes >= dataset.num_episodes:
        return np.arange(dataset.num_frames)
    return np.arange(dataset.episode_range(max_episodes - 1)[1])


def episodes_frames(dataset: LeRobotDataset, episodes: list[int]) -> np.ndarray:
    """Frame indices of `episodes`, in order."""
    return np.concatenate([np.arange(*dataset.episode_range(e)) for e in episodes] or [np.zeros(0, int)])


def critic_without_simulator(cfg: ExperimentConfig) -> ExperimentConfig:
    """A preset's critic on `privileged` state (for RL in a simulator) reads the actor's inputs instead when
    a dataset alone is the source: nothing provides that state."""
    value_keys = cfg.policy.value_obs_keys
    if PRIVILEGED not in value_keys:
        return cfg
    kept = tuple(k for k in value_keys if k != PRIVILEGED)
    log.info(
        "no simulator: the critic reads %s instead of %s", list(kept or cfg.policy.obs_keys), list(value_keys)
    )
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, value_obs_keys=kept))


def warmup_cosine(warmup: int, total: int):
    """LR multiplier: linear warm-up over `warmup` steps, then cosine decay to 0 at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(total - warmup, 1)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


class SFTRunner(Runner):
    """Trains `policy.sft_loss` on action chunks, with atomic checkpoints and evaluation in the env, or
    with env=none (no simulator) validation on held-out episodes of the dataset."""

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, resume: bool = False) -> None:
        self.cfg, self.run_dir, sft = cfg, run_dir, cfg.sft
        resume = resume and self.resumable()
        if sft.source == "dataset" and not sft.dataset:
            raise UserError("set sft.dataset=<folder written by `embodrl collect`>")
        if launched_by_torchrun():
            raise UserError(
                "SFT runs in one process: run `embodrl sft` (or `embodrl train` without torchrun) first, "
                "then torchrun `embodrl train` with policy.init_from=<its checkpoints/last/policy>"
            )
        if cfg.train.torch_threads:
            torch.set_num_threads(cfg.train.torch_threads)
        torch.manual_seed(cfg.seed)
        self.val_frames: list[int] = []  # env=none: frames of the held-out episodes
        self.stream: SimulatedDemos | None = None  # sft.source=expert: demos played live
        if sft.source == "expert":
            self._stream_expert(resume)
        else:
            self._read_dataset(resume)
        print(estimate_policy_memory(self.policy, sft.batch_size, sft.precision).report(), flush=True)
        trainable = [p for p in self.policy.parameters() if p.requires_grad]  # LoRA / frozen groups
        self.optimizer = torch.optim.AdamW(trainable, lr=sft.lr, weight_decay=sft.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, warmup_cosine(sft.warmup_steps, sft.steps)
        )
        self.step = 0
        self.pending_losses: list[float] = []  # since the last logged loss: a resume averages the same steps
        # the best is chosen on success in the env; without one, the last checkpoint is the result
        self.best = BestCheckpoint(run_dir) if sft.keep_best and self.env is not None else None
        if resume:
            self._restore()

    def _read_dataset(self, resume: bool) -> None:
        """Samples from the frames of sft.dataset (its first sft.max_episodes episodes)."""
        cfg, sft = self.cfg, self.cfg.sft
        dataset = LeRobotDataset(sft.dataset)
        if cfg.env.suite == NO_SIMULATOR:
            self.env = None
            cfg = self.cfg = critic_without_simulator(cfg)
            inputs = dataset_inputs(dataset, cfg.policy.normalized_keys, sft.key_map)
            self.policy = build_policy_for(cfg, PolicySpace.of_dataset(inputs, sft.dataset))
            key_map, instructions = inputs.features, inputs.tasks
            held_out = held_out_episodes(dataset.num_episodes, sft.val_episodes)
            kept = dataset.num_episodes - len(held_out)
            frames = first_episodes_frames(dataset, min(sft.max_episodes or kept, kept))
            self.val_frames = episodes_frames(dataset, held_out).tolist()
            print(
                f"no simulator: {len(inputs.features)} inputs from {sft.dataset} "
                f"({', '.join(f'{k} <- {v}' for k, v in inputs.features.items())}), {inputs.action_dim}-D "
                f"actions; validation on {len(held_out)} held-out episode(s)",
                flush=True,
            )
        else:
            self.env = make_env(cfg.env, device=cfg.device)
            self.policy = build_policy(cfg, self.env)
            key_map, instructions = sft.key_map, self.env.instruction_table
            frames = first_episodes_frames(dataset, sft.max_episodes)
        self.chunks = chunks = ActionChunkDataset(
            dataset,
            self.policy.cfg.chunk_size,
            obs_keys=self._sample_keys(),
            action_dim=self.policy.cfg.action_dim,
            instruction_table=instructions,
            key_map=key_map,
        )
        self.num_samples = len(frames)
        if not resume and not cfg.policy.init_from:
            self.policy.set_normalization(chunks.normalization_stats())
        self.samples = Subset(chunks, frames.tolist())

    def _stream_expert(self, resume: bool) -> None:
        """`embodrl pretrain`: samples of the scripted expert playing a second env of the run's config live
        (the first env evaluates); the stream starts with the first batch, seeded by the step it starts at."""
        cfg = self.cfg
        if cfg.env.suite == NO_SIMULATOR:
            raise UserError("sft.source=expert plays the scripted expert; it needs a simulator, not env=none")
        self.env = make_env(cfg.env, device=cfg.device)
        self.policy = build_policy(cfg, self.env)
        self.num_samples = 0  # the stream counts its own
        self.normalize_from_stream = not resume and not cfg.policy.init_from

    def _start_stream(self, seed: int) -> SimulatedDemos:
        cfg, sft = self.cfg, self.cfg.sft
        stream = SimulatedDemos(
            make_env(cfg.env, device=cfg.device),
            tuple(self._sample_keys()),
            self.policy.cfg.chunk_size,
            sft.stream_pool,
            sft.stream_reuse,
            sft.stream_first_state_id,
            sft.stream_states,
            seed=seed,
            perturb=sft.stream_perturb,
            perturb_steps=sft.stream_perturb_steps,
            policy=self._stream_policy_chunks,
            policy_share=sft.stream_policy_share,
        )
        warm = min(sft.stream_pool, max(4 * sft.batch_size, 2048))
        print(f"playing the scripted expert for a first {warm} samples ...", flush=True)
        stream.fill(warm)
        if self.normalize_from_stream:
            self.policy.set_normalization(stream.normalization_stats())
        return stream

    def _stream_policy_chunks(self, obs: TensorDict) -> torch.Tensor:
        """The action chunks the policy as it trains now takes in the stream's episodes it plays (DAgger)."""
        with in_eval_mode(self.policy), torch.no_grad():
            return self.policy.act(obs.to(self.cfg.device), deterministic=True).actions

    def _sample_keys(self) -> list[str]:
        """What a sample holds: the actor's inputs and the auxiliary SFT targets (task ids come apart)."""
        return [k for k in self.policy.cfg.normalized_keys if k != "task_id"]

    def batches(self) -> Iterator[TensorDict]:
        """Training batches from the current step on, endlessly; each epoch in a seeded order of its own, so
        a resumed run draws the batches the uninterrupted one does (streamed demos: new scenes instead)."""
        if self.cfg.sft.source == "expert":
            return self._streamed_batches()
        sampler = ShuffledBatches(
            len(self.samples), self.cfg.sft.batch_size, self.cfg.seed, drop_last=True, first_step=self.step
        )
        # The generator only seeds worker processes (the batches come from the sampler): fixed, so starting
        # the loader at a resume draws nothing from torch's global RNG, which the checkpoint restores.
        return DataLoader(
            self.samples,
            batch_sampler=sampler,
            collate_fn=collate_chunks,
            num_workers=self.cfg.sft.num_workers,
            generator=torch.Generator().manual_seed(self.cfg.seed),
        )

    def _streamed_batches(self) -> Iterator[TensorDict]:
        seed = self.cfg.seed * 1_000_003 + self.step  # a resumed run plays and draws anew from its step
        if self.stream is None:
            self.stream = self._start_stream(seed)
        generator = torch.Generator().manual_seed(seed)
        while True:
            yield self.stream.batch(self.cfg.sft.batch_size, generator)

    def train_step(self, batch: TensorDict) -> float:
        """One optimizer step on `batch` (clipped gradients, scheduler advanced); returns the loss."""
        sft, device = self.cfg.sft, torch.device(self.cfg.device)
        batch = batch.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=sft.precision == "bf16"):
            loss = self.policy.sft_loss(batch)
        if not torch.isfinite(loss):
            raise UserError(f"SFT loss became {loss.item()} at step {self.step}; lower sft.lr")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), sft.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return loss.item()

    def learn(self) -> dict:
        sft = self.cfg.sft
        logger = self.open_logger("sft", sft.steps, self.step)
        self.policy.train()
        log_every = max(1, min(50, sft.steps // 20))
        started, seen = time.perf_counter(), 0
        consistent = True  # False inside a step: a checkpoint then would hold half of it
        with StopAtIterationEnd("step") as stop:
            try:
                for batch in self.batches():
                    if self.step >= sft.steps:
                        break
                    consistent = False
                    loss = self.train_step(batch)
                    self.pending_losses.append(loss)
                    consistent = True
                    seen += batch.batch_size[0]
                    metrics = {}
                    if self.step % log_every == 0 or self.step == sft.steps:
                        elapsed = time.perf_counter() - started
                        metrics = {
                            "sft/loss": sum(self.pending_losses) / len(self.pending_losses),
                            "sft/lr": self.scheduler.get_last_lr()[0],
                            "sft/samples_per_s": seen / max(elapsed, 1e-9),
                        }
                        if self.stream is not None:  # how many scenes the expert played for this process
                            metrics["sft/expert_episodes"] = self.stream.episodes
                            metrics["sft/expert_bursts"] = self.stream.bursts
                            if self.cfg.sft.stream_policy_share > 0:
                                metrics["sft/policy_episodes"] = self.stream.policy_episodes
                                metrics["sft/policy_success"] = self.stream.policy_success
                        self.pending_losses, started, seen = [], time.perf_counter(), 0
                    if sft.eval_every and self.step % sft.eval_every == 0:
                        metrics.update(self.evaluate())
                        if self.best is not None:
                            self.best.consider(self.step, metrics, self.policy)
                    if metrics:
                        logger.log(self.step, metrics)
                    else:
                        logger.advance()
                    if self.step % sft.save_every == 0:
                        self.save()
                    if stop.requested():  # Ctrl-C or SIGTERM: after this step, saved by `finally`
                        raise stop.interruption()
            finally:  # nothing lost on a crash, Ctrl-C or SIGTERM; never half a step over the last checkpoint
                logger.close()
                if consistent:
                    self.save()
                else:
                    warn_unsaved(self.run_dir, "step", self.step + 1)
        if self.env is None:
            summary = {"samples": self.samples_seen, "steps": self.step, **self.evaluate()}
            return self.conclude(summary, self.step, {}, self.policy, 0)
        results = evaluate_policy(
            self.policy,
            self.env,
            sft.eval_episodes,
            record=sft.videos,
            video_dir=self.run_dir / "videos",
            progress=True,
            seed=self.cfg.seed,
        )
        summary = {"samples": self.samples_seen, "steps": self.step, **summarize(results)}
        return self.conclude(summary, self.step, eval_metrics(results), self.policy, sft.eval_episodes)

    @property
    def samples_seen(self) -> int:
        """Training samples: the dataset's frames, or those the streamed expert made."""
        return self.stream.samples_made if self.stream is not None else self.num_samples

    def evaluate(self) -> dict[str, float]:
        """Success in the env, or without one the validation loss and action error on held-out episodes
        (nothing when none are held out)."""
        if self.env is not None:
            return eval_metrics(self.play_from(self.policy))
        if not self.val_frames:
            return {}
        return validation_metrics(
            self.policy, self.chunks, self.val_frames, self.cfg.sft.batch_size, self.cfg.device
        )

    def play_from(self, policy: nn.Module, first_state_id: int = 0) -> EpisodeResults:
        """`policy`'s evaluation episodes from initial state `first_state_id` on, in the run's env."""
        return evaluate_policy(
            policy, self.env, self.cfg.sft.eval_episodes, seed=self.cfg.seed, first_state_id=first_state_id
        )

    def save(self) -> Path:
        """Write checkpoints/last: the policy, the step, optimizer and scheduler, the loader's RNG."""
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "pending_losses": self.pending_losses,
        }
        return self.save_last(self.policy, state, {}, self.step)

    def _restore(self) -> None:
        state = self.restore_last(self.policy, {})
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        self.pending_losses = list(state.get("pending_losses", []))
