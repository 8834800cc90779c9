"""Flow-SDE: the noise schedule and the stochastic step's log-prob against an independent computation."""

import pytest
import torch
from tensordict import TensorDict
from torch.distributions import Normal

from embodrl.policies.config import PolicyConfig
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.registry import make_policy

N, C, A, S, K = 4, 2, 3, 5, 4


def sde_policy(noise_level: float = 0.5):
    torch.manual_seed(0)
    cfg = PolicyConfig(
        family="flow",
        chunk_size=C,
        action_dim=A,
        flow=FlowConfig(likelihood="sde", num_steps=K, sde_noise_level=noise_level),
    )
    return make_policy(cfg, {"state": (S,)})


def test_step_std_follows_the_reference_schedule():
    # pi_RL's Flow-SDE noise sigma_t = a * sqrt(t / (1 - t)), dt in the denominator at t = 1:
    # K=4, a=0.5 gives sigma = [1.0, 0.866, 0.5, 0.289], std = sigma * sqrt(1/4)
    head = sde_policy(0.5).head
    x = torch.zeros(K, C, A)
    t = torch.tensor([1.0, 0.75, 0.5, 0.25])
    _, std = head._sde_step(x, torch.zeros_like(x), t, torch.full((K,), 0.5))
    torch.testing.assert_close(std[:, 0, 0], torch.tensor([0.5, 0.4330, 0.25, 0.1443]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("noise_level", [0.3, 0.7])
def test_logprob_is_the_gaussian_density_of_the_stored_step(noise_level):
    policy = sde_policy(noise_level)
    obs = TensorDict({"state": torch.randn(N, S)}, batch_size=[N])
    out = policy.act(obs)
    chain, k = out.replay["chain"], int(out.replay["sde_step"][0])
    t, dt = 1.0 - k / K, 1.0 / K
    sigma = noise_level * (t / (dt if t == 1.0 else 1.0 - t)) ** 0.5
    with torch.no_grad():
        x = chain[:, k]
        v = policy.velocity_net(policy.encoder(obs), x, torch.full((N,), t))
    mean = x - dt * (v + sigma**2 / (2 * t) * (x + (1 - t) * v))
    expected = Normal(mean, sigma * dt**0.5).log_prob(chain[:, k + 1])
    torch.testing.assert_close(out.logprob, expected, atol=1e-5, rtol=1e-5)


def test_annealing_the_noise_level_keeps_stored_transitions_scoring_identically():
    policy = sde_policy(0.5)
    obs = TensorDict({"state": torch.randn(N, S)}, batch_size=[N])
    out = policy.act(obs)
    policy.head.noise_level = 0.2  # e.g. a trainer's annealing schedule between rollout and update
    assert torch.equal(policy.evaluate(obs, out.replay).logprob, out.logprob)
