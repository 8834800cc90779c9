"""Small but real behaviour-cloning runs: the loss falls and sampled actions approach the targets."""

import pytest
import torch
from tensordict import TensorDict

from embodrl.policies.config import PolicyConfig
from embodrl.policies.normalization import compute_stats
from embodrl.policies.registry import make_policy

S, C, A = 6, 2, 3


def linear_demos(n: int, weights: torch.Tensor, generator: torch.Generator) -> TensorDict:
    """Actions a linear function of the state: action[c] = W_c @ state, in env units."""
    state = torch.randn(n, S, generator=generator) * 2 + 1
    action = torch.einsum("cas,ns->nca", weights, state - 1) * 0.2 + 0.5
    return TensorDict({"state": state, "action": action}, batch_size=[n])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["flow", "gaussian"])
def test_sft_on_a_linear_task_lowers_the_loss_and_reaches_the_targets(family):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(C, A, S, generator=g)
    train, test = linear_demos(2048, weights, g), linear_demos(256, weights, g)
    policy = make_policy(PolicyConfig(family=family, chunk_size=C, action_dim=A), {"state": (S,)})
    policy.set_normalization(
        {"state": compute_stats(train["state"]), "action": compute_stats(train["action"])}
    )
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)
    losses = []
    for _ in range(600):
        batch = train[torch.randint(0, len(train), (128,), generator=g)]
        loss = policy.sft_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    error = (policy.act(test, deterministic=True).actions - test["action"]).pow(2).mean()
    baseline = (test["action"] - train["action"].mean(0)).pow(2).mean()  # predicting the mean chunk
    print(f"{family}: loss {first:.3f} -> {last:.3f}, action MSE {error:.4f} vs mean-chunk {baseline:.4f}")
    assert last < 0.3 * first
    assert error < 0.05 * baseline
