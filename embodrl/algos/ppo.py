"""The PPO/GRPO update: advantages, then epochs of clipped-loss minibatches (RSL-RL's `update`).

Works on any policy that follows the Policy contract (`evaluate`, `critic_parameters`) without
importing policies: it is math on the rollout TensorDict. Details that matter, named where they
happen: separate actor/critic learning rates (constant or annealed linearly to 0), critic-only warm-up
iterations, reward scaling and advantage normalization (per rollout or per minibatch), grad-norm
clipping, target-KL early stop of the actor epochs, a ratio check on the first minibatch (must be 1),
and running observation normalization updated after the epochs (algos/running_stats.py).

Samples from an asynchronous rollout carry the weight `version` that produced them. Where it is
older than the actor's (`iteration`: the number of updates done), the update uses decoupled PPO
(Hilton et al. 2022, as in AReaL): the clipped ratio is taken against the proximal policy (the
actor's weights at the start of this update, recomputed here) and the surrogate is weighted by
pi_prox / pi_behaviour, capped at `algo.behaviour_weight_cap`. Fresh samples keep the stored
log-prob as proximal one, so a rollout without stale samples gives exactly the synchronous update.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from tensordict import TensorDict
from torch import nn

from embodrl.algos.advantage import compute_advantages, normalize_advantages
from embodrl.algos.config import AlgoConfig
from embodrl.algos.ppo_loss import ppo_loss
from embodrl.algos.running_stats import RewardScaler, RunningObsNormalization
from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.errors import UserError
from embodrl.parallel.distributed import sum_tensor_over_ranks

if TYPE_CHECKING:
    from embodrl.parallel.data_parallel import DataParallel

_MAX_LOG_WEIGHT = 20.0  # exp() beyond this overflows float32
# What a minibatch's loss reads: cutting only these out of the rollout (not rewards, flags, actions,
# versions) halves the cost of making a minibatch, ~a tenth of an update on a small MLP.
LOSS_KEYS = (
    "obs",
    "replay",
    "logprob",
    "prox_logprob",
    "value",
    "advantages",
    "returns",
    "mask",
    "traj_length",
)


class PPO:
    """Owns the optimizer and runs one update per rollout; GRPO is PPO with the group estimator."""

    def __init__(
        self,
        policy: nn.Module,
        cfg: AlgoConfig,
        reference: nn.Module | None = None,
        data_parallel: DataParallel | None = None,
        bf16: bool = False,
        total_iterations: int = 0,
        continue_episodes: bool = False,
    ) -> None:
        """total_iterations: where algo.lr_schedule=linear reaches 0; continue_episodes: rollouts carry
        episodes over (the reward scaler's running return then carries over too)."""
        self.policy, self.cfg, self.data_parallel = policy, cfg, data_parallel
        if cfg.lr_schedule == "linear" and total_iterations < 1:
            raise ValueError("algo.lr_schedule='linear' needs total_iterations (train.iterations)")
        self.total_iterations, self.continue_episodes = total_iterations, continue_episodes
        # bf16 autocast of the update's forward passes (train.precision); the loss stays fp32
        device_type = next(policy.parameters()).device.type
        self._autocast = lambda: torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16)
        # with data parallelism the gradients are averaged over ranks inside backward
        self.evaluate = policy.evaluate if data_parallel is None else data_parallel.evaluate
        critic = {id(p) for p in policy.critic_parameters()}
        actor_params = [p for p in policy.parameters() if id(p) not in critic and p.requires_grad]
        self._actor_params = actor_params
        self._params = list(policy.parameters())  # walked once: named_parameters() per minibatch adds up
        groups = [{"params": actor_params, "lr": cfg.actor_lr, "name": "actor"}]
        if cfg.uses_critic:
            critic_params = [p for p in policy.critic_parameters() if p.requires_grad]
            groups.append({"params": critic_params, "lr": cfg.critic_lr, "name": "critic"})
        # fused: one kernel for all parameters instead of a Python loop per tensor (3x faster per step on
        # a CPU for small MLPs; the same Adam update)
        self.optimizer = torch.optim.Adam(groups, eps=1e-5, fused=True)
        self.base_lrs = [group["lr"] for group in groups]
        self.obs_normalization = (
            RunningObsNormalization(policy.normalizers) if cfg.obs_normalization else None
        )
        self.reward_scaler = RewardScaler(cfg.gamma, cfg.reward_clip) if cfg.reward_scaling else None
        self.reference = reference
        if cfg.kl_coef > 0 and reference is None:  # KL to the policy we started from
            self.reference = copy.deepcopy(policy).requires_grad_(False).eval()

    def update(self, buffer: RolloutBuffer, iteration: int, generator: torch.Generator) -> dict[str, float]:
        """Compute advantages into the buffer, then optimize; returns mean metrics of the update."""
        cfg = self.cfg
        data = buffer.data
        self._set_learning_rates(iteration)
        if self.reward_scaler is not None:
            done = data["terminated"] | data["truncated"]
            data["reward"] = self.reward_scaler.scale(
                data["reward"], data["steps_executed"], done, self.continue_episodes, self._reduce()
            )
        data.update(compute_advantages(data, buffer.last_value, cfg).to_tensordict())
        data["prox_logprob"] = self._proximal_logprob(data, iteration)
        stale = bool((data["prox_logprob"] != data["logprob"]).any())  # samples of older weights (async)
        all_valid = bool(data["mask"].all())  # GAE keeps every sample: no per-minibatch selection then
        critic_only = cfg.uses_critic and iteration < cfg.critic_warmup_iters
        sums: dict[str, float] = defaultdict(float)
        count, stopped_early, first = 0, False, None
        for _ in range(cfg.num_epochs):
            for batch in buffer.minibatches(cfg.minibatch_size, generator, LOSS_KEYS):
                if not all_valid:
                    batch = batch[batch["mask"]]
                if cfg.normalize_advantages == "minibatch":  # over the whole minibatch, before sharding
                    batch["advantages"] = normalize_advantages(batch["advantages"], None, cfg.eps)
                empty = batch.batch_size[0] == 0
                if self.data_parallel is not None:
                    batch = self.data_parallel.shard(batch)
                    empty = self.data_parallel.any_empty(batch)  # every rank skips it, or none does
                if empty:
                    continue
                out = self._loss(batch, critic_only, stale)
                if first is None:
                    first = float(out.ratio_max_dev)  # behaviour and current policy are the same here
                approx_kl = (
                    out.approx_kl if self.data_parallel is None else self.data_parallel.mean(out.approx_kl)
                )
                if not critic_only and cfg.target_kl is not None and approx_kl > cfg.target_kl:
                    stopped_early = True
                    break
                self.optimizer.zero_grad(set_to_none=True)
                loss = out.value_loss * cfg.value_coef if critic_only else out.loss
                loss.backward()
                if critic_only:  # the value loss must not move a shared encoder during warm-up
                    for p in self._actor_params:
                        p.grad = None
                if cfg.max_grad_norm is not None:
                    sums["grad_norm"] += self._clip_gradients(cfg.max_grad_norm)
                self.optimizer.step()
                for key, value in out.metrics().items():
                    sums[key] += value
                count += 1
            if stopped_early:
                break
        if self.obs_normalization is not None:  # after the epochs: the next rollout acts with the new stats
            self.obs_normalization.update(data["obs"], self._reduce())
        metrics = {key: value / max(count, 1) for key, value in sums.items()}
        metrics.update(
            minibatches=float(count),
            stopped_early=float(stopped_early),
            valid_fraction=float(data["mask"].float().mean()),  # the samples GRPO's group filter kept
            critic_only=float(critic_only),
            ratio0_maxdev=first if first is not None else 0.0,
            actor_lr=self.optimizer.param_groups[0]["lr"],
        )
        return metrics

    def _clip_gradients(self, max_norm: float) -> float:
        """Scale the gradients to a global norm of at most `max_norm`; returns the norm before.

        torch's clip_grad_norm_ in one process, without its grouping by device and dtype (one policy has
        one of each): 60 instead of 100 us per minibatch of a small MLP, a sixteenth of the update.
        Sharded (DTensor) gradients of data parallelism go through torch's.
        """
        if self.data_parallel is not None:
            return float(nn.utils.clip_grad_norm_(self._params, max_norm))
        grads = [p.grad for p in self._params if p.grad is not None]
        if not grads:
            return 0.0
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp(max=1.0))  # torch's formula
        return float(total)

    def _reduce(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """Sum over ranks for the running statistics when every rank collected its own rollout."""
        if self.data_parallel is None or self.data_parallel.shared_rollout:
            return None
        return sum_tensor_over_ranks

    def _set_learning_rates(self, iteration: int) -> None:
        """algo.lr_schedule: constant, or linear from the set rates to 0 at total_iterations (CleanRL's
        annealing: update i of n runs at (1 - i / n) x the rate). A function of the iteration alone, so a
        resumed run continues the schedule exactly."""
        frac = 1.0 - iteration / self.total_iterations if self.cfg.lr_schedule == "linear" else 1.0
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * max(frac, 0.0)

    @torch.no_grad()
    def _proximal_logprob(self, data: TensorDict, version: int) -> torch.Tensor:
        """Log-probs [T, N, ...] of the current weights where samples are stale, the stored ones elsewhere."""
        prox = data["logprob"].clone()
        if "version" not in data.keys():
            return prox
        stale = (data["version"] != version).nonzero()  # [S, 2] (t, n) of samples from older weights
        for start in range(0, stale.shape[0], self.cfg.minibatch_size):
            t, n = stale[start : start + self.cfg.minibatch_size].unbind(-1)
            samples = data[t, n]
            with self._autocast():
                prox[t, n] = self.policy.evaluate(samples["obs"], samples["replay"]).logprob.float()
        return prox

    def _loss(self, batch: TensorDict, critic_only: bool, stale: bool):
        cfg = self.cfg
        with self._autocast():
            ev = self.evaluate(batch["obs"], batch["replay"])
            ref_logprob = None
            if cfg.kl_coef > 0 and not critic_only:
                with torch.no_grad():
                    ref_logprob = self.reference.evaluate(batch["obs"], batch["replay"]).logprob.float()
        return ppo_loss(
            cfg,
            logprob=ev.logprob.float(),
            old_logprob=batch["prox_logprob"],
            behaviour_weight=self._behaviour_weight(batch) if stale else None,
            advantages=batch["advantages"],
            mask=None,  # update() dropped the invalid samples
            entropy=ev.entropy.float(),
            values=ev.value.float() if cfg.uses_critic else None,
            old_values=batch["value"] if cfg.uses_critic else None,
            returns=batch["returns"] if cfg.uses_critic else None,
            ref_logprob=ref_logprob,
            traj_length=batch["traj_length"],
        )

    def _behaviour_weight(self, batch: TensorDict) -> torch.Tensor:
        """pi_prox / pi_behaviour per element (decoupled PPO); 1 for fresh samples."""
        log_weight = batch["prox_logprob"] - batch["logprob"]
        weight = log_weight.clamp(max=_MAX_LOG_WEIGHT).exp()
        cap = self.cfg.behaviour_weight_cap
        return weight if cap is None else weight.clamp(max=cap)

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict()}
        if self.obs_normalization is not None:
            state["obs_normalization"] = self.obs_normalization.state_dict()
        if self.reward_scaler is not None:
            state["reward_scaler"] = self.reward_scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        for key, part in (
            ("obs_normalization", self.obs_normalization),
            ("reward_scaler", self.reward_scaler),
        ):
            if part is not None:
                if key not in state:
                    raise UserError(
                        f"the checkpoint has no {key} state: it was trained with algo.{key}=false"
                    )
                part.load_state_dict(state[key])
