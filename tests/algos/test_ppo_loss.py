import math

import pytest
import torch

from embodrl.algos.config import AlgoConfig
from embodrl.algos.ppo_loss import aggregate, clipped_value_loss, kl_k3, ppo_loss


def _loss(cfg, log_ratio, advantages, **kwargs):
    """ppo_loss with chunk-level log-probs [B] whose log-ratio to the old ones is `log_ratio`."""
    old = torch.zeros(len(log_ratio))
    new = torch.tensor(log_ratio, dtype=torch.float32, requires_grad=True)
    mask = kwargs.pop("mask", torch.ones(len(log_ratio), dtype=torch.bool))
    return new, ppo_loss(cfg, new, old, torch.tensor(advantages), mask, **kwargs)


def test_ratio_one_gives_no_clip_no_kl_and_minus_mean_advantage():
    cfg = AlgoConfig(dual_clip=3.0)
    logprob = torch.randn(5, 4, 7)  # token granularity [B, C, A]
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0, -1.0])
    out = ppo_loss(cfg, logprob.clone().requires_grad_(), logprob, adv, torch.ones(5, dtype=torch.bool))
    assert out.clip_fraction == 0 and out.dual_clip_fraction == 0
    assert out.approx_kl == 0 and out.ratio_max_dev == 0
    assert out.policy_loss.item() == pytest.approx(-adv.mean().item())
    assert set(out.metrics()) >= {"approx_kl", "clip_fraction", "ratio_max_dev", "loss"}


def test_clip_inactive_inside_the_range():
    new, out = _loss(AlgoConfig(), [math.log(1.1)], [2.0])
    assert out.policy_loss.item() == pytest.approx(-2.2)
    assert out.clip_fraction == 0
    out.loss.backward()
    assert new.grad.item() == pytest.approx(-2.2)  # d(-A * exp(x))/dx


@pytest.mark.parametrize(
    ("ratio", "adv", "expected"),
    [
        (1.5, 1.0, -1.2),  # A > 0, ratio above 1 + eps_high: capped
        (0.5, -1.0, 0.8),  # A < 0, ratio below 1 - eps_low: capped
    ],
)
def test_clip_active_caps_the_objective_and_cuts_the_gradient(ratio, adv, expected):
    new, out = _loss(AlgoConfig(), [math.log(ratio)], [adv])
    assert out.policy_loss.item() == pytest.approx(expected)
    assert out.clip_fraction == 1
    out.loss.backward()
    assert new.grad.item() == 0


def test_pessimistic_side_is_not_clipped():
    # A > 0 and ratio low: the unclipped term is the max, the gradient flows.
    new, out = _loss(AlgoConfig(), [math.log(0.5)], [1.0])
    assert out.policy_loss.item() == pytest.approx(-0.5)
    assert out.clip_fraction == 0
    out.loss.backward()
    assert new.grad.item() == pytest.approx(-0.5)


def test_asymmetric_clip_uses_eps_high_above_one():
    _, out = _loss(
        AlgoConfig(clip_eps_low=0.2, clip_eps_high=0.28), [math.log(1.3), math.log(0.7)], [1.0, -1.0]
    )
    # max(-1.3, -1.28) = -1.28 and max(0.7, 0.8) = 0.8
    assert out.policy_loss.item() == pytest.approx((-1.28 + 0.8) / 2)


def test_dual_clip_bounds_negative_advantage_losses():
    _, plain = _loss(AlgoConfig(), [math.log(5.0)], [-1.0])
    assert plain.policy_loss.item() == pytest.approx(5.0)
    new, dual = _loss(AlgoConfig(dual_clip=3.0), [math.log(5.0)], [-1.0])
    assert dual.policy_loss.item() == pytest.approx(3.0)
    assert dual.dual_clip_fraction == 1
    dual.loss.backward()
    assert new.grad.item() == 0
    # Positive advantages and small ratios are untouched by the dual clip.
    _, pos = _loss(AlgoConfig(dual_clip=3.0), [math.log(5.0), math.log(2.0)], [1.0, -1.0])
    assert pos.policy_loss.item() == pytest.approx((-1.2 + 2.0) / 2)
    assert pos.dual_clip_fraction == 0


def test_value_loss_clipping_mse_and_huber():
    values, old, returns = torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([1.0])
    # Unclipped error 0, clipped prediction 0.2 -> error 0.8: the max keeps the clipped one.
    mse = clipped_value_loss(values, old, returns, AlgoConfig(value_loss="mse", value_clip=0.2))
    assert mse.item() == pytest.approx(0.5 * 0.8**2)
    huber = clipped_value_loss(values, old, returns, AlgoConfig(value_loss="huber", huber_delta=0.5))
    assert huber.item() == pytest.approx(0.5 * (0.8 - 0.25))
    off = clipped_value_loss(values, old, returns, AlgoConfig(value_loss="mse", value_clip=None))
    assert off.item() == 0
    # Moving away from the target beyond the clip is penalized unclipped (max of the two).
    far = clipped_value_loss(torch.tensor([-1.0]), old, returns, AlgoConfig(value_loss="mse"))
    assert far.item() == pytest.approx(0.5 * 2.0**2)


def test_total_loss_combines_terms_with_their_coefficients():
    cfg = AlgoConfig(value_loss="mse", value_clip=None, value_coef=0.5, entropy_coef=0.1, kl_coef=0.2)
    logprob = torch.zeros(2, requires_grad=True)
    ref = torch.tensor([math.log(2.0), 0.0])
    out = ppo_loss(
        cfg,
        logprob,
        torch.zeros(2),
        torch.tensor([1.0, 1.0]),
        torch.ones(2, dtype=torch.bool),
        entropy=torch.tensor([1.0, 3.0]),
        values=torch.tensor([0.0, 0.0]),
        old_values=torch.zeros(2),
        returns=torch.tensor([2.0, 0.0]),
        ref_logprob=ref,
    )
    kl = (2.0 - 1.0 - math.log(2.0)) / 2
    assert out.kl_ref.item() == pytest.approx(kl)
    assert out.value_loss.item() == pytest.approx((0.5 * 4.0 + 0.0) / 2)
    assert out.entropy.item() == pytest.approx(2.0)
    assert out.loss.item() == pytest.approx(-1.0 + 0.5 * 1.0 - 0.1 * 2.0 + 0.2 * kl)


def test_kl_k3_is_zero_at_equality_and_positive_otherwise():
    x = torch.randn(100)
    assert kl_k3(x, x).abs().max() == 0
    assert (kl_k3(x, x + torch.randn(100)) > 0).all()


def test_kl_to_reference_requires_reference_logprobs():
    with pytest.raises(ValueError, match="ref_logprob"):
        _loss(AlgoConfig(kl_coef=0.1), [0.0], [1.0])


def test_masked_elements_are_ignored_even_when_garbage():
    cfg = AlgoConfig()
    logprob = torch.tensor([[0.0, float("nan")], [math.log(1.1), 50.0]], requires_grad=True)  # [B, C]
    mask = torch.tensor([[True, False], [True, False]])
    out = ppo_loss(cfg, logprob, torch.zeros(2, 2), torch.tensor([1.0, 2.0]), mask)
    assert out.policy_loss.item() == pytest.approx((-1.0 - 2.2) / 2)
    assert out.clip_fraction == 0 and torch.isfinite(out.approx_kl)
    out.loss.backward()
    assert torch.isfinite(logprob.grad).all() and (logprob.grad[:, 1] == 0).all()


def test_token_granularity_broadcasts_sample_advantages_and_masks():
    cfg = AlgoConfig()
    log_ratio = torch.log(
        torch.tensor([[[1.1, 1.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 0.9]]])
    )  # [B=2, C=2, A=2]
    out = ppo_loss(
        cfg, log_ratio, torch.zeros(2, 2, 2), torch.tensor([1.0, -1.0]), torch.tensor([True, True])
    )
    expected = (-(1.1 + 1 + 1 + 1) + (1 + 1 + 1 + 0.9)) / 8
    assert out.policy_loss.item() == pytest.approx(expected)
    only_first = ppo_loss(
        cfg, log_ratio, torch.zeros(2, 2, 2), torch.tensor([1.0, -1.0]), torch.tensor([True, False])
    )
    assert only_first.policy_loss.item() == pytest.approx(-4.1 / 4)


def test_seq_mean_token_mean_weighs_every_trajectory_equally():
    values = torch.tensor([4.0, 1.0, 1.0, 1.0])  # trajectory a: 1 sample; trajectory b: 3 samples
    mask = torch.ones(4, dtype=torch.bool)
    length = torch.tensor([1.0, 3.0, 3.0, 3.0])
    assert aggregate(values, mask, "token-mean", length).item() == pytest.approx(7 / 4)
    assert aggregate(values, mask, "seq-mean-token-mean", length).item() == pytest.approx((4 + 1) / 2)
    with pytest.raises(ValueError, match="traj_length"):
        aggregate(values, mask, "seq-mean-token-mean", None)
    # An all-masked minibatch contributes zero, not NaN.
    assert aggregate(values, torch.zeros(4, dtype=torch.bool), "token-mean", None).item() == 0


def test_ppo_loss_with_seq_mean_aggregation_uses_traj_length():
    cfg = AlgoConfig(loss_agg="seq-mean-token-mean")
    _, out = _loss(cfg, [0.0, 0.0, 0.0], [3.0, 0.0, 0.0], traj_length=torch.tensor([1.0, 2.0, 2.0]))
    assert out.policy_loss.item() == pytest.approx(-3.0 / 2)


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean"])
def test_no_mask_equals_an_all_true_mask(loss_agg):
    """PPO passes mask=None (all samples valid): the same loss, metrics and gradients as an all-true mask."""
    cfg = AlgoConfig(loss_agg=loss_agg, dual_clip=3.0, entropy_coef=0.01, kl_coef=0.1)
    gen = torch.Generator().manual_seed(0)
    b = 16
    old = torch.randn(b, 4, generator=gen)
    kwargs = dict(
        entropy=torch.rand(b, generator=gen),
        old_values=torch.randn(b, generator=gen),
        returns=torch.randn(b, generator=gen),
        ref_logprob=old + 0.1 * torch.randn(b, 4, generator=gen),
        traj_length=torch.randint(1, 9, (b,), generator=gen).float(),
    )
    start = old + 0.3 * torch.randn(b, 4, generator=gen)
    start_values = torch.randn(b, generator=gen)
    advantages = torch.randn(b, generator=gen)
    results = []
    for mask in (None, torch.ones(b, dtype=torch.bool)):
        logprob, values = start.clone().requires_grad_(), start_values.clone().requires_grad_()
        out = ppo_loss(cfg, logprob, old, advantages, mask, values=values, **kwargs)
        out.loss.backward()
        results.append((out.metrics(), logprob.grad, values.grad))
    (metrics, grad, value_grad), (metrics_masked, grad_masked, value_grad_masked) = results
    assert metrics["clip_fraction"] > 0
    assert metrics == pytest.approx(metrics_masked, rel=1e-6, abs=1e-7)
    torch.testing.assert_close(grad, grad_masked)
    torch.testing.assert_close(value_grad, value_grad_masked)
