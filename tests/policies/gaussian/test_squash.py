"""gaussian.squash=tanh, SAC's actor: bounded actions, the tanh-corrected density, the saved format."""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch.distributions import Normal, TransformedDistribution
from torch.distributions.transforms import TanhTransform

from embodrl.policies.config import PolicyConfig
from embodrl.policies.gaussian.configuration import GaussianConfig
from embodrl.policies.loading import load_policy
from embodrl.policies.registry import make_policy


def squashed(chunk: int = 2):
    torch.manual_seed(0)
    cfg = PolicyConfig(
        family="gaussian",
        chunk_size=chunk,
        action_dim=3,
        obs_keys=("state",),
        action_normalization="identity",
        gaussian=GaussianConfig(hidden_dims=(16,), squash="tanh"),
    )
    return make_policy(cfg, {"state": (4,)})


def obs(n: int = 64) -> TensorDict:
    return TensorDict({"state": 3 * torch.randn(n, 4, generator=torch.Generator().manual_seed(1))}, [n])


def test_actions_stay_in_bounds_and_the_log_prob_is_the_tanh_transformed_density():
    policy = squashed()
    out = policy.act(obs())
    assert out.actions.abs().max() <= 1 and out.actions.shape == (64, 2, 3)
    features = policy.encoder(obs())
    mean, log_std = policy._mean_log_std(features)
    reference = TransformedDistribution(Normal(mean, log_std.exp()), TanhTransform(cache_size=1))
    inside = out.actions.abs() < 0.999  # where float32 tanh(u) is not rounded to +-1 (an infinite density)
    expected = reference.log_prob(out.actions)  # identity normalization: the actions are tanh(u)
    assert inside.float().mean() > 0.5
    torch.testing.assert_close(out.logprob[inside], expected[inside], atol=1e-3, rtol=1e-3)
    again = policy.evaluate(obs(), out.replay)
    assert torch.equal(again.logprob, out.logprob)  # replay keeps u: the same number, not an atanh of it


def test_reparameterized_samples_carry_gradients_and_match_act_in_distribution():
    policy = squashed(chunk=1)
    actions, logprob = policy.sample_reparameterized(obs())
    assert actions.shape == (64, 1, 3) and logprob.shape == (64,)
    (actions.sum() + logprob.sum()).backward()
    assert all(p.grad is not None for p in policy.actor.parameters())


def test_the_saved_policy_acts_as_the_trained_one_and_exports_the_squashed_mean(tmp_path):
    policy = squashed()
    policy.save_pretrained(tmp_path / "policy")
    loaded = load_policy(tmp_path / "policy")
    deterministic = policy.act(obs(), deterministic=True).actions
    torch.testing.assert_close(loaded.act(obs(), deterministic=True).actions, deterministic)
    torch.testing.assert_close(policy.action_program()(obs()["state"]), deterministic)
    assert not hasattr(policy, "log_std")  # the std comes from the state
