"""The clipped PPO loss (also used by GRPO), in the form of references/algorithms.md §0.

Per element of the log-prob granularity (token [B, C, A], action [B, C] or chunk [B]):
    ratio  = exp(logprob - old_logprob)
    L      = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high))
    dual clip (c > 1), for A < 0 only:  L = min(L, -c * A)
    loss   = agg(L) - entropy_coef * agg(H) + value_coef * agg(V loss) + kl_coef * agg(KL_k3(pi || pi_ref))
Decoupled PPO (stale samples of an async rollout): old_logprob is the proximal policy's and L is
multiplied by behaviour_weight = pi_prox / pi_behaviour (1 for fresh samples).
Aggregations over valid elements: "token-mean" weighs every element alike; "seq-mean-token-mean"
weighs element by 1 / (its trajectory's length), so every trajectory contributes equally (RLinf's
masked_mean_ratio), self-normalized within the minibatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from embodrl.algos import registry
from embodrl.algos.config import AlgoConfig

# exp() of a log-ratio beyond this overflows float32 or gives meaningless k3 values.
_MAX_LOG_RATIO = 20.0


@dataclass
class PPOLossOut:
    """The total loss (with grad), its parts and the update's health metrics (detached)."""

    loss: torch.Tensor  # scalar: what the optimizer minimizes
    policy_loss: torch.Tensor
    value_loss: torch.Tensor  # 0 without a critic
    entropy: torch.Tensor
    kl_ref: torch.Tensor  # KL to the reference policy (k3); 0 without one
    approx_kl: torch.Tensor  # k3 estimate of KL(old || new); the target-KL early stop reads it
    clip_fraction: torch.Tensor  # share of valid elements where the ratio clip cut the gradient
    dual_clip_fraction: torch.Tensor  # share where the dual clip bound was active
    ratio_max_dev: torch.Tensor  # max |ratio - 1|: 0 on the first minibatch of an update

    def metrics(self) -> dict[str, float]:
        """Every field as a Python float (one device sync), for logging."""
        names = list(self.__dataclass_fields__)
        values = torch.stack([getattr(self, name).detach().float() for name in names]).tolist()
        return dict(zip(names, values, strict=True))


def mse_value_loss(error: torch.Tensor, cfg: AlgoConfig) -> torch.Tensor:
    """0.5 * error^2, elementwise."""
    return 0.5 * error.square()


def huber_value_loss(error: torch.Tensor, cfg: AlgoConfig) -> torch.Tensor:
    """Huber with delta `cfg.huber_delta`: equals 0.5 * error^2 for |error| <= delta."""
    return F.huber_loss(error, torch.zeros_like(error), reduction="none", delta=cfg.huber_delta)


def broadcast_like(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Expand x [B, *prefix] over the trailing dims of like [B, *prefix, *rest]."""
    return x.reshape(x.shape + (1,) * (like.dim() - x.dim())).expand_as(like)


def aggregate(
    values: torch.Tensor, mask: torch.Tensor | None, mode: str, traj_length: torch.Tensor | None
) -> torch.Tensor:
    """Weighted mean of values [B, ...] over mask (same shape; None: every element is valid) by the
    module's aggregation modes."""
    if mask is None and mode == "token-mean":  # PPO's minibatches: a plain mean, a third of the ops
        return values.mean()
    weights = torch.ones_like(values) if mask is None else mask.to(values.dtype)
    if mode == "seq-mean-token-mean":
        if traj_length is None:
            raise ValueError("loss_agg='seq-mean-token-mean' needs traj_length [B] for every sample")
        weights = weights / broadcast_like(traj_length.to(values.dtype), weights)
    if mask is not None:
        values = torch.where(mask, values, torch.zeros_like(values))  # masked entries may hold garbage
    return (values * weights).sum() / weights.sum().clamp_min(torch.finfo(values.dtype).tiny)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float, dual_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-element loss, clip-active and dual-clip-active masks (None without a dual clip); advantages
    already broadcast to ratio."""
    negated = -advantages
    unclipped = negated * ratio
    clipped = negated * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped
    if dual_clip is None:
        return loss, clip_active, None
    bound = negated * dual_clip  # for A < 0: a positive cap on the loss when ratio grows large
    dual_active = (advantages < 0) & (bound < loss)
    return torch.where(dual_active, bound, loss), clip_active, dual_active


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, cfg: AlgoConfig
) -> torch.Tensor:
    """Per-sample value loss [B]: max(l(R - V), l(R - V_clipped)) with V_clipped = V_old +- value_clip."""
    loss_fn = registry.get("value_loss", cfg.value_loss)
    loss = loss_fn(returns - values, cfg)
    if cfg.value_clip is None:
        return loss
    clipped = old_values + (values - old_values).clamp(-cfg.value_clip, cfg.value_clip)
    return torch.maximum(loss, loss_fn(returns - clipped, cfg))


def kl_k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """Elementwise k3 estimate of KL(pi || pi_ref) from samples of pi: exp(d) - 1 - d, d = ref - logprob."""
    log_ratio = (ref_logprob - logprob).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.expm1(log_ratio) - log_ratio


def ppo_loss(
    cfg: AlgoConfig,
    logprob: torch.Tensor,  # [B, ...] new log-probs with grad: token [B, C, A], action [B, C] or chunk [B]
    old_logprob: torch.Tensor,  # same shape, stored at rollout time
    advantages: torch.Tensor,  # [B]
    mask: torch.Tensor | None,  # bool [B] or [B, ...] (a prefix of logprob's shape); None: all valid
    entropy: torch.Tensor | None = None,  # [B] or a prefix of logprob's shape
    values: torch.Tensor | None = None,  # [B] critic output with grad; None without a critic
    old_values: torch.Tensor | None = None,  # [B] stored at rollout time
    returns: torch.Tensor | None = None,  # [B] value targets
    ref_logprob: torch.Tensor | None = None,  # like logprob, from the frozen reference policy
    traj_length: torch.Tensor | None = None,  # [B], needed by loss_agg="seq-mean-token-mean"
    behaviour_weight: torch.Tensor | None = None,  # like logprob: pi_prox / pi_behaviour (decoupled PPO)
) -> PPOLossOut:
    """Clipped surrogate + value + entropy + reference-KL terms over one minibatch (module docstring)."""
    mask = None if mask is None else broadcast_like(mask.bool(), logprob)
    log_ratio = logprob - old_logprob
    if mask is not None:
        log_ratio = torch.where(mask, log_ratio, torch.zeros_like(logprob))
    log_ratio = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    surrogate, clip_active, dual_active = clipped_surrogate(
        ratio, broadcast_like(advantages, ratio), cfg.clip_eps_low, cfg.clip_eps_high, cfg.dual_clip
    )

    if behaviour_weight is not None:
        surrogate = surrogate * behaviour_weight.detach()

    def agg(x: torch.Tensor, m: torch.Tensor | None = mask) -> torch.Tensor:
        return aggregate(x, m, cfg.loss_agg, traj_length)

    zero = logprob.new_zeros(())
    policy_loss = agg(surrogate)
    total = policy_loss
    entropy_mean = zero if entropy is None else agg(broadcast_like(entropy, logprob))
    if cfg.entropy_coef > 0:
        total = total - cfg.entropy_coef * entropy_mean
    value_loss = zero
    if values is not None:
        if old_values is None or returns is None:
            raise ValueError("the value loss needs old_values and returns along with values")
        sample_mask = None if mask is None else mask.reshape(mask.shape[0], -1).any(-1)  # [B]
        value_loss = agg(clipped_value_loss(values, old_values, returns, cfg), sample_mask)
        total = total + cfg.value_coef * value_loss
    kl_ref = zero
    if cfg.kl_coef > 0:
        if ref_logprob is None:
            raise ValueError("algo.kl_coef > 0 needs ref_logprob from a frozen reference policy")
        kl_ref = agg(kl_k3(logprob, ref_logprob))
        total = total + cfg.kl_coef * kl_ref

    with torch.no_grad():
        valid = None if mask is None else mask.sum().clamp_min(1)

        def share(x: torch.Tensor) -> torch.Tensor:  # mean over the valid elements
            return x.float().mean() if mask is None else torch.where(mask, x, 0).sum() / valid

        approx_kl = share(torch.expm1(log_ratio) - log_ratio)
        clip_fraction = share(clip_active)
        dual_clip_fraction = zero if dual_active is None else share(dual_active)
        deviation = (ratio - 1).abs()
        ratio_max_dev = (deviation if mask is None else torch.where(mask, deviation, 0.0)).max()
    return PPOLossOut(
        loss=total,
        policy_loss=policy_loss,
        value_loss=value_loss,
        entropy=entropy_mean,
        kl_ref=kl_ref,
        approx_kl=approx_kl,
        clip_fraction=clip_fraction,
        dual_clip_fraction=dual_clip_fraction,
        ratio_max_dev=ratio_max_dev,
    )
