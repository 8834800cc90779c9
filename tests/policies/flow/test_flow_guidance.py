"""Guided real-time chunking's sampler: the soft mask, the guidance weight, a hand-computed guided chain,
zero guidance as plain Euler, and the flow policies' `act_guided` pulling the first d actions to the
target."""

import math

import pytest
import torch
from tensordict import TensorDict

from embodrl.errors import UserError
from embodrl.policies.base import ChunkGuidance
from embodrl.policies.config import PolicyConfig
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.flow.guidance import guidance_weight, guided_euler_sample, prefix_weights
from embodrl.policies.flow.sampling import euler_sample
from embodrl.policies.normalization import compute_stats
from embodrl.policies.registry import make_policy
from tests.policies.vla_testing import build, make_obs

H, A, S, N = 8, 3, 5, 4


def test_prefix_weights_are_one_for_the_delay_then_decay_to_zero_at_the_overlap_end():
    w = prefix_weights(torch.tensor([2, 0]), torch.tensor([6, 3]), H)
    c = [(6 - i) / (6 - 2 + 1) for i in range(2, 6)]
    expected = [1.0, 1.0, *(ci * math.expm1(ci) / (math.e - 1) for ci in c), 0.0, 0.0]
    torch.testing.assert_close(w[0], torch.tensor(expected))
    assert (w[0, 1:] <= w[0, :-1]).all() and 0 < w[0, 5] < w[0, 2] < 1
    assert w[1, 0] < 1 and (w[1, 3:] == 0).all()  # no delay: nothing frozen, still a soft pull


def test_prefix_weights_with_a_delay_beyond_the_overlap_freeze_the_overlap_only():
    weights = prefix_weights(torch.tensor([5]), torch.tensor([3]), 4)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1, 1, 0]]))


def test_guidance_weight_is_capped_at_beta_and_follows_the_paper_in_between():
    assert guidance_weight(1.0, 5.0) == 5.0  # tau = 0: the paper's weight diverges
    assert guidance_weight(0.5, 5.0) == pytest.approx(2.0)  # (tau^2 + t^2) / (tau t) at tau = t = 1/2
    tau = 0.25
    r2 = (1 - tau) ** 2 / (tau**2 + (1 - tau) ** 2)
    assert guidance_weight(1 - tau, 10.0) == pytest.approx((1 - tau) / (tau * r2))
    assert guidance_weight(0.75, 0.0) == 0.0


def linear_field(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return t.view(-1, 1, 1) * x - 0.3  # denoised x - t v = (1 - t^2) x + 0.3 t, so dDenoised/dx = 1 - t^2


def test_a_guided_chain_matches_the_hand_computed_vector_jacobian_product():
    x0, y, w, beta, k_steps = 0.8, -1.5, 0.6, 5.0, 4
    x = x0
    for k in range(k_steps):
        t = 1.0 - k / k_steps
        v = t * x - 0.3
        correction = w * (y - (x - t * v)) * (1 - t * t)
        x = x - (v - guidance_weight(t, beta) * correction) / k_steps
    x0_t, y_t, w_t = (torch.full((1, 1, 1), value) for value in (x0, y, w))
    out = guided_euler_sample(linear_field, x0_t, k_steps, y_t, w_t, beta)
    assert out.item() == pytest.approx(x, rel=1e-5)


def test_zero_guidance_weight_is_plain_euler_sampling_exactly():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(H * A + 1, 32), torch.nn.Tanh(), torch.nn.Linear(32, H * A))

    def velocity(x, t):
        return net(torch.cat([x.flatten(1), t[:, None]], -1)).view(-1, H, A)

    x0, target = torch.randn(N, H, A), torch.randn(N, H, A)
    weights = prefix_weights(torch.full((N,), 2), torch.full((N,), 6), H)[..., None]
    guided = guided_euler_sample(velocity, x0, 5, target, weights, max_weight=0.0)
    assert torch.equal(guided, euler_sample(velocity, x0, 5))
    unmasked = guided_euler_sample(velocity, x0, 5, target, torch.zeros_like(target), max_weight=5.0)
    torch.testing.assert_close(unmasked, euler_sample(velocity, x0, 5))  # W = 0: no pull either


def mlp_flow_policy():
    torch.manual_seed(0)
    cfg = PolicyConfig(family="flow", chunk_size=H, action_dim=A, flow=FlowConfig(num_steps=5))
    policy = make_policy(cfg, {"state": (S,)})
    g = torch.Generator().manual_seed(1)
    policy.set_normalization({"action": compute_stats(torch.randn(300, A, generator=g) * 0.5 + 0.2)})
    return policy.eval()


def guided_vs_plain(policy, obs, prev: torch.Tensor, delay: int, overlap: int, beta: float):
    n = prev.shape[0]
    guidance = ChunkGuidance(prev, torch.full((n,), overlap), torch.full((n,), delay), max_weight=beta)
    torch.manual_seed(7)
    guided = policy.act_guided(obs, guidance)
    torch.manual_seed(7)
    plain = policy.act(obs, deterministic=True).actions
    return guided, plain


def test_mlp_flow_act_guided_without_guidance_is_the_deterministic_act():
    policy = mlp_flow_policy()
    obs = TensorDict({"state": torch.randn(N, S)}, batch_size=[N])
    guided, plain = guided_vs_plain(policy, obs, torch.randn(N, H, A), delay=2, overlap=6, beta=0.0)
    assert guided.shape == (N, H, A)
    assert torch.equal(guided, plain)


def test_mlp_flow_act_guided_pulls_the_first_d_actions_to_the_previous_chunk():
    policy = mlp_flow_policy()
    obs = TensorDict({"state": torch.randn(N, S)}, batch_size=[N])
    prev = torch.randn(N, H, A) * 0.5 + 0.2  # env units, like the policy's actions
    guided, plain = guided_vs_plain(policy, obs, prev, delay=3, overlap=6, beta=5.0)
    gap_guided = (guided[:, :3] - prev[:, :3]).norm(dim=-1).mean()
    gap_plain = (plain[:, :3] - prev[:, :3]).norm(dim=-1).mean()
    assert gap_guided < 0.25 * gap_plain
    repeated, _ = guided_vs_plain(policy, obs, prev, delay=3, overlap=6, beta=5.0)
    assert torch.equal(repeated, guided)  # deterministic given the noise


def test_vla_flow_act_guided_pulls_its_first_actions_too():
    policy = build("flow", flow={"conditioning": "vla", "action_horizon": 4, "max_action_dim": 5}).eval()
    obs = make_obs(3)
    prev = torch.randn(3, 2, 3) * 0.3
    guided, plain = guided_vs_plain(policy, obs, prev, delay=1, overlap=2, beta=5.0)
    assert guided.shape == plain.shape == (3, 2, 3)
    assert (guided[:, 0] - prev[:, 0]).norm() < 0.5 * (plain[:, 0] - prev[:, 0]).norm()
    same, plain = guided_vs_plain(policy, obs, prev, delay=1, overlap=2, beta=0.0)
    assert torch.equal(same, plain)


def test_families_without_guidable_sampling_refuse_with_one_line():
    policy = make_policy(PolicyConfig(family="gaussian", chunk_size=H, action_dim=A), {"state": (S,)})
    assert not policy.can_guide_chunks
    guidance = ChunkGuidance(torch.zeros(1, H, A), torch.tensor([4]), torch.tensor([1]))
    with pytest.raises(UserError, match="chunk.mode=rtc"):
        policy.act_guided(TensorDict({"state": torch.zeros(1, S)}, batch_size=[1]), guidance)
