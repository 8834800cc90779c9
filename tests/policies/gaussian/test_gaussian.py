"""Gaussian actor specifics: deterministic mean, init std, entropy, log-prob in normalized units."""

import math

import torch
from tensordict import TensorDict
from torch.distributions import Normal

from embodrl.policies.config import PolicyConfig
from embodrl.policies.gaussian.configuration import GaussianConfig
from embodrl.policies.normalization import compute_stats
from embodrl.policies.registry import make_policy

N, C, A, S = 5, 2, 3, 4


def gaussian_policy(init_std: float = 0.5):
    torch.manual_seed(0)
    cfg = PolicyConfig(
        family="gaussian", chunk_size=C, action_dim=A, gaussian=GaussianConfig(init_std=init_std)
    )
    policy = make_policy(cfg, {"state": (S,)})
    policy.set_normalization({"action": compute_stats(torch.randn(200, A) * 0.3 + 0.2)})
    return policy


def test_deterministic_act_returns_the_unnormalized_mean():
    policy = gaussian_policy()
    obs = TensorDict({"state": torch.randn(N, S)}, batch_size=[N])
    out = policy.act(obs, deterministic=True)
    with torch.no_grad():
        mean = policy.actor(policy.encoder(obs)).view(N, C, A)
    torch.testing.assert_close(out.actions, policy.normalizers["action"].unnormalize(mean))


def test_logprob_and_entropy_are_those_of_the_normalized_diagonal_gaussian():
    policy = gaussian_policy(init_std=0.5)
    obs = TensorDict({"state": torch.randn(N, S)}, batch_size=[N])
    out = policy.act(obs)
    with torch.no_grad():
        mean = policy.actor(policy.encoder(obs)).view(N, C, A)
    action_norm = policy.normalizers["action"](out.actions)
    torch.testing.assert_close(out.replay["action_norm"], action_norm, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logprob, Normal(mean, 0.5).log_prob(out.replay["action_norm"]))
    entropy = policy.evaluate(obs, out.replay).entropy
    torch.testing.assert_close(entropy, torch.full((N,), 0.5 * math.log(2 * math.pi * math.e * 0.25)))


def test_samples_are_not_squashed_or_clipped_by_the_policy():
    policy = gaussian_policy(init_std=5.0)
    out = policy.act(TensorDict({"state": torch.randn(200, S)}, batch_size=[200]))
    assert out.actions.abs().max() > 1.5  # the env clips to its bounds, not the policy


def test_orthogonal_init_follows_cleanrl_gains():
    torch.manual_seed(0)
    cfg = PolicyConfig(
        family="gaussian", chunk_size=C, action_dim=A, gaussian=GaussianConfig(init="orthogonal")
    )
    policy = make_policy(cfg, {"state": (S,)})
    for net, output_gain in ((policy.actor, 0.01), (policy.critic.net, 1.0)):
        linears = [m for m in net if isinstance(m, torch.nn.Linear)]
        for i, layer in enumerate(linears):
            gain = output_gain if i == len(linears) - 1 else math.sqrt(2)
            w = layer.weight  # [out, in]: orthogonal rows or columns, whichever are fewer
            gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            torch.testing.assert_close(gram, gain**2 * torch.eye(gram.shape[0]), atol=1e-5, rtol=1e-4)
            assert not layer.bias.any()
