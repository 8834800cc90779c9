"""Small SFT learning tests for the VLA families: the loss falls on synthetic state -> action data."""

import pytest
import torch
from tensordict import TensorDict

from tests.policies.vla_testing import A, C, S, build, make_obs


def synthetic_batch(n: int, seed: int) -> TensorDict:
    """Actions a smooth function of the state, repeated over the chunk."""
    batch = make_obs(n, seed)
    target = torch.tanh(0.5 * (batch["state"][:, :A] - 1.0))  # [n, A]
    batch["action"] = target.unsqueeze(1).expand(n, C, A).clone()
    return batch


def sft_losses(policy, steps: int, lr: float) -> list[float]:
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        loss = policy.sft_loss(synthetic_batch(32, seed=step))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, overrides, steps",
    [
        ("autoregressive", {"autoregressive": {"decoding": "parallel"}}, 120),
        ("autoregressive", {"autoregressive": {"decoding": "sequential"}}, 100),
        ("diffusion", {"diffusion": {"conditioning": "vla"}}, 80),
    ],
)
def test_sft_loss_falls(family, overrides, steps):
    assert S >= A
    policy = build(family, obs_keys=("state",), **overrides)
    losses = sft_losses(policy, steps=steps, lr=1e-3)
    first, last = losses[0], sum(losses[-10:]) / 10  # untrained loss vs the last ten steps
    assert last < 0.75 * first, (first, last)
