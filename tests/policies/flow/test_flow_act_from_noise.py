"""`act_from_noise`: the flow policy's deterministic ODE from a given x0 (what noise-space RL steers) is
act(deterministic=True)'s chunk for that x0 and the exported program's; other families refuse in one line."""

import pytest
import torch
from tensordict import TensorDict

from embodrl.errors import UserError
from embodrl.policies.config import PolicyConfig
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.normalization import compute_stats
from embodrl.policies.registry import make_policy
from tests.policies.vla_testing import build, make_obs

C, A, S, N = 4, 3, 5, 6


def mlp_flow_policy(likelihood: str):
    torch.manual_seed(0)
    cfg = PolicyConfig(family="flow", chunk_size=C, action_dim=A, flow=FlowConfig(likelihood=likelihood))
    policy = make_policy(cfg, {"state": (S,)})
    g = torch.Generator().manual_seed(1)
    policy.set_normalization({"action": compute_stats(torch.randn(300, A, generator=g) * 0.5 + 0.2)})
    return policy.eval()


@pytest.mark.parametrize("likelihood", ["noise", "sde"])
def test_the_deterministic_act_is_the_ode_from_the_noise_it_draws(likelihood):
    policy = mlp_flow_policy(likelihood)
    obs = TensorDict({"state": torch.randn(N, S)}, batch_size=[N])
    assert policy.can_act_from_noise and policy.noise_shape == (C, A)
    torch.manual_seed(3)
    x0 = torch.randn(N, *policy.noise_shape)  # what act draws first under this seed
    torch.manual_seed(3)
    acted = policy.act(obs, deterministic=True).actions
    assert torch.equal(policy.act_from_noise(obs, x0), acted)
    program = policy.action_program()  # the exported ODE takes the same x0 as an input
    torch.testing.assert_close(program(obs["state"], x0), acted)


def test_the_chunk_depends_on_the_noise_and_nothing_else():
    policy = mlp_flow_policy("noise")
    obs = TensorDict({"state": torch.randn(N, S)}, batch_size=[N])
    zeros = torch.zeros(N, C, A)
    assert torch.equal(policy.act_from_noise(obs, zeros), policy.act_from_noise(obs, zeros))
    assert not torch.allclose(policy.act_from_noise(obs, zeros), policy.act_from_noise(obs, zeros + 1.5))


def test_a_vla_flow_policy_starts_from_its_padded_model_chunk():
    policy = build("flow", flow={"conditioning": "vla", "action_horizon": 4, "max_action_dim": 5}).eval()
    obs = make_obs(3)
    assert policy.noise_shape == (4, 5)
    torch.manual_seed(5)
    x0 = torch.randn(3, 4, 5)
    torch.manual_seed(5)
    acted = policy.act(obs, deterministic=True).actions
    torch.testing.assert_close(policy.act_from_noise(obs, x0), acted)
    assert acted.shape == (3, *policy.chunk_shape)


def test_families_without_a_noise_input_refuse_with_one_line():
    policy = make_policy(PolicyConfig(family="gaussian", chunk_size=C, action_dim=A), {"state": (S,)})
    assert not policy.can_act_from_noise
    for call in (lambda: policy.noise_shape, lambda: policy.act_from_noise(None, torch.zeros(1, C, A))):
        with pytest.raises(UserError, match="flow policy") as error:
            call()
        assert "\n" not in str(error.value)
