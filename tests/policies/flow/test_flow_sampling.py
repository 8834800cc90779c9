"""The flow sampler against hand-computed Euler integration, and Flow-SDE with a = 0 against Euler."""

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from embodrl.policies.config import PolicyConfig
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.flow.sampling import euler_sample
from embodrl.policies.registry import make_policy

C, A, S = 2, 3, 4


class LinearField(nn.Module):
    """v(x, t) = t * x - b: linear in x, time-dependent, ignores the observation."""

    def __init__(self, b: float) -> None:
        super().__init__()
        self.b = b

    def forward(self, features, x, t):
        return t.view(-1, 1, 1) * x - self.b


def hand_euler(x0: float, b: float, num_steps: int) -> float:
    """x_{k+1} = x_k - dt * (t_k * x_k - b), t_k = 1 - k / K, in plain Python floats."""
    x, dt = x0, 1.0 / num_steps
    for k in range(num_steps):
        t = 1.0 - k / num_steps
        x = x - dt * (t * x - b)
    return x


def flow_policy(likelihood: str, num_steps: int, noise_level: float = 0.5):
    cfg = PolicyConfig(
        family="flow",
        chunk_size=C,
        action_dim=A,
        action_normalization="identity",
        flow=FlowConfig(likelihood=likelihood, num_steps=num_steps, sde_noise_level=noise_level),
    )
    return make_policy(cfg, {"state": (S,)})


def obs(n: int = 5) -> TensorDict:
    return TensorDict({"state": torch.randn(n, S)}, batch_size=[n])


@pytest.mark.parametrize("num_steps", [1, 3, 4])
@pytest.mark.parametrize("likelihood", ["noise", "sde"])
def test_deterministic_act_matches_hand_computed_euler_on_a_linear_field(likelihood, num_steps):
    policy = flow_policy(likelihood, num_steps)
    policy.velocity_net = LinearField(b=0.3)
    out = policy.act(obs(), deterministic=True)
    x0 = out.replay["chain"][:, 0]
    expected = torch.tensor([hand_euler(v, 0.3, num_steps) for v in x0.flatten().tolist()]).view_as(x0)
    torch.testing.assert_close(out.actions, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(
        euler_sample(lambda x, t: LinearField(0.3)(None, x, t), x0, num_steps), expected
    )


def test_sde_with_zero_noise_level_is_plain_euler():
    policy = flow_policy("sde", num_steps=4, noise_level=0.0)
    o = obs()
    out = policy.act(o)  # stochastic act, but a = 0 makes the SDE step deterministic
    with torch.no_grad():
        features = policy.encoder(o)
        euler = euler_sample(lambda x, t: policy.velocity_net(features, x, t), out.replay["chain"][:, 0], 4)
    torch.testing.assert_close(out.actions, euler, atol=1e-7, rtol=0)


def test_sde_perturbs_exactly_the_stored_step_and_keeps_the_others_euler():
    torch.manual_seed(0)
    policy = flow_policy("sde", num_steps=4, noise_level=0.5)
    o = obs()
    seen = set()
    for _ in range(12):
        out = policy.act(o)
        chain, k_star = out.replay["chain"], int(out.replay["sde_step"][0])
        assert (out.replay["sde_step"] == k_star).all()  # one stochastic step per call
        seen.add(k_star)
        with torch.no_grad():
            features = policy.encoder(o)
            for k in range(4):
                t = torch.full((o.shape[0],), 1 - k / 4)
                euler = chain[:, k] - 0.25 * policy.velocity_net(features, chain[:, k], t)
                assert torch.allclose(chain[:, k + 1], euler) == (k != k_star)
    assert seen == {0, 1, 2, 3}  # k* ~ U{0..K-1}
