"""Normalizer round trips and stats checks."""

import pytest
import torch

from embodrl.errors import UserError
from embodrl.policies.config import PolicyConfig
from embodrl.policies.modules.obs_encoder import make_normalizers
from embodrl.policies.normalization import Normalizer, compute_stats


@pytest.mark.parametrize("mode", ["mean_std", "quantile", "identity"])
def test_unnormalize_inverts_normalize(mode):
    data = torch.randn(500, 3) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([0.0, 2.0, -1.0])
    norm = Normalizer("action", 3, mode)
    norm.set_stats(compute_stats(data))
    torch.testing.assert_close(norm.unnormalize(norm(data)), data, atol=1e-5, rtol=1e-5)


def test_mean_std_and_quantile_scale_as_documented():
    data = torch.randn(10_000, 2) * 3 + 1
    stats = compute_stats(data)
    standard = Normalizer("state", 2, "mean_std")
    standard.set_stats(stats)
    z = standard(data)
    torch.testing.assert_close(z.mean(0), torch.zeros(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(z.std(0), torch.ones(2), atol=1e-3, rtol=0)
    quantile = Normalizer("action", 2, "quantile")
    quantile.set_stats(stats)
    torch.testing.assert_close(quantile(stats["q01"]), -torch.ones(2))
    torch.testing.assert_close(quantile(stats["q99"]), torch.ones(2))


def test_defaults_are_identity_and_constant_dims_stay_finite():
    norm = Normalizer("state", 2, "mean_std")
    x = torch.randn(4, 2)
    torch.testing.assert_close(norm(x), x, atol=1e-5, rtol=1e-5)
    norm.set_stats(compute_stats(torch.ones(10, 2)))  # std 0
    assert torch.isfinite(norm(x)).all()


def test_stats_of_wrong_size_raise_user_error():
    norm = Normalizer("state", 3, "mean_std")
    with pytest.raises(UserError, match="state.mean have 2 values"):
        norm.set_stats({"mean": [0.0, 1.0], "min": [0.0]})


def test_normalized_values_are_clipped_and_unclipped_when_clip_is_zero():
    stats = {"mean": [0.0, 0.0], "std": [0.01, 1.0]}
    clipped, free = Normalizer("state", 2, "mean_std", clip=5.0), Normalizer("state", 2, "mean_std")
    clipped.set_stats(stats)
    free.set_stats(stats)
    x = torch.tensor([[1.0, -2.0]])  # 100 std out in the first dim
    torch.testing.assert_close(clipped(x), torch.tensor([[5.0, -2.0]]), atol=1e-4, rtol=1e-4)
    assert free(x)[0, 0] > 99


@pytest.mark.parametrize("mode", ["mean_std", "quantile"])
def test_held_constant_dims_read_a_label_that_moves_them_as_the_constant(mode):
    demos = torch.stack([torch.linspace(-1, 1, 50), torch.zeros(50)], dim=1)  # dim 1 never moves
    held, raw = Normalizer("action", 2, mode, hold_constant=True), Normalizer("action", 2, mode)
    held.set_stats(compute_stats(demos))
    raw.set_stats(compute_stats(demos))
    takeover = torch.tensor([[0.5, 0.3]])  # a human rolls the wrist the demos never rolled
    assert raw(takeover)[0, 1].abs() > 1e4  # the division by EPS this guards against
    torch.testing.assert_close(held(takeover), held(torch.tensor([[0.5, 0.0]])))
    torch.testing.assert_close(held(takeover)[0, 0], raw(takeover)[0, 0])  # moving dims unchanged
    back = held.unnormalize(held(takeover))
    torch.testing.assert_close(back, torch.tensor([[0.5, 0.0]]), atol=1e-5, rtol=0)


def test_policies_hold_constant_action_dims_but_not_state_dims():
    norms = make_normalizers(PolicyConfig(action_dim=2), {"state": (3,)})
    assert norms["action"].hold_constant and not norms["state"].hold_constant
