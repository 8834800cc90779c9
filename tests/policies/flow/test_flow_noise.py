"""Flow-Noise: the chain log-prob against Gaussian log-densities computed independently, and the std range."""

import math

import pytest
import torch
from tensordict import TensorDict
from torch.distributions import Normal

from embodrl.policies.config import PolicyConfig
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.registry import make_policy

N, C, A, S, K = 4, 2, 3, 5, 4


def flow_noise_policy(reduction: str, logprob_type: str = "token"):
    torch.manual_seed(0)
    cfg = PolicyConfig(
        family="flow",
        chunk_size=C,
        action_dim=A,
        logprob_type=logprob_type,
        flow=FlowConfig(likelihood="noise", num_steps=K, chain_reduction=reduction),
    )
    policy = make_policy(cfg, {"state": (S,)})
    torch.nn.init.normal_(policy.head.net[-1].weight, std=0.5)  # a state- and time-dependent sigma
    return policy


def independent_chain_logprob(policy, obs: TensorDict, chain: torch.Tensor) -> torch.Tensor:
    """log N(x_0; 0, I) + sum_k log N(x_{k+1}; x_k - v/K, sigma_k^2) per element, via torch.distributions."""
    with torch.no_grad():
        features = policy.encoder(obs)
        total = Normal(0.0, 1.0).log_prob(chain[:, 0])
        for k in range(K):
            t = torch.full((chain.shape[0],), 1.0 - k / K)
            mean = chain[:, k] - policy.velocity_net(features, chain[:, k], t) / K
            total = total + Normal(mean, policy.head.std(features, t)).log_prob(chain[:, k + 1])
    return total  # [N, C, A]


@pytest.mark.parametrize("logprob_type", ["token", "action", "chunk"])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_chain_logprob_equals_sum_of_independent_gaussian_log_densities(reduction, logprob_type):
    policy = flow_noise_policy(reduction, logprob_type)
    obs = TensorDict({"state": torch.randn(N, S)}, batch_size=[N])
    out = policy.act(obs)
    expected = independent_chain_logprob(policy, obs, out.replay["chain"])
    if reduction == "mean":
        expected = expected / (K + 1)
    expected = {"token": expected, "action": expected.sum(-1), "chunk": expected.sum((1, 2))}[logprob_type]
    torch.testing.assert_close(out.logprob, expected, atol=1e-5, rtol=1e-5)


def test_noise_std_starts_mid_range_and_stays_within_bounds():
    cfg = FlowConfig(noise_std_min=0.08, noise_std_max=0.16)
    policy = make_policy(PolicyConfig(family="flow", chunk_size=C, action_dim=A, flow=cfg), {"state": (S,)})
    features, t = torch.randn(N, S), torch.rand(N)
    torch.testing.assert_close(policy.head.std(features, t), torch.full((N, C, A), math.sqrt(0.08 * 0.16)))
    torch.nn.init.normal_(policy.head.net[-1].weight, std=100.0)  # saturate the tanh
    std = policy.head.std(features * 10, t)
    assert std.min() >= 0.08 - 1e-6 and std.max() <= 0.16 + 1e-6
    assert std.min() < 0.081 and std.max() > 0.159


def test_entropy_is_the_mean_gaussian_entropy_of_the_step_stds():
    policy = flow_noise_policy("mean")
    obs = TensorDict({"state": torch.randn(N, S)}, batch_size=[N])
    out = policy.act(obs)
    entropy = policy.evaluate(obs, out.replay).entropy
    with torch.no_grad():
        features = policy.encoder(obs)
        stds = [policy.head.std(features, torch.full((N,), 1.0 - k / K)) for k in range(K)]
    expected = torch.stack([Normal(0.0, s).entropy().mean((1, 2)) for s in stds]).mean(0)
    torch.testing.assert_close(entropy, expected)
