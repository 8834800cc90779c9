"""DSRL-NA (algos/noise_aliasing.py): the TD critic reads the decoded chunks, the noise critic regresses on
it, the actor climbs the noise critic, and its state round-trips."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from embodrl.algos import registry
from embodrl.algos.config import AlgoConfig
from embodrl.algos.noise_aliasing import NoiseAliasedSAC
from embodrl.algos.sac import SAC
from embodrl.errors import ConfigError, UserError
from tests.algos.test_sac import ACTION, batch, squashed_policy

BOUND = 1.5


class ShiftDecoder:
    """Decodes noise [B, 1, ACTION] into one 3-D env action: tanh of the noise's sum plus the state."""

    decoded_shape = (1, 3)

    def __init__(self) -> None:
        self.calls = 0

    def decode(self, obs: TensorDict, noise: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return torch.tanh(noise.sum(-1, keepdim=True) + obs["state"][:, None, :])


def aliased(**overrides) -> NoiseAliasedSAC:
    torch.manual_seed(0)
    cfg = AlgoConfig(name="dsrl_na", noise_policy="x", num_critics=2, critic_hidden_dims=(16,), **overrides)
    return NoiseAliasedSAC(squashed_policy(), cfg, decoder=ShiftDecoder())


def test_dsrl_na_is_registered_and_needs_the_steered_policy():
    assert registry.get("off_policy", "dsrl_na") is NoiseAliasedSAC
    assert not AlgoConfig(name="dsrl_na", noise_policy="x").on_policy
    with pytest.raises(ConfigError, match="set algo.noise_policy"):
        AlgoConfig(name="dsrl_na")
    with pytest.raises(UserError, match="set algo.noise_policy"):
        NoiseAliasedSAC(squashed_policy(), AlgoConfig(name="dsrl_na", noise_policy="x"))
    with pytest.raises(UserError, match="use algo.name=sac"):
        NoiseAliasedSAC(
            squashed_policy(obs_keys=("state", "rgb")),
            AlgoConfig(name="dsrl_na", noise_policy="x"),
            decoder=ShiftDecoder(),
        )


def test_the_td_critic_reads_the_decoded_chunk_and_the_noise_critic_the_noise():
    algo = aliased()
    data = batch()
    obs, noise = data["obs"], data["action"]
    decoded = algo.decoder.decode(obs, noise)
    vector, _ = algo.critic_inputs(obs, noise)
    noise_vector, _ = algo.noise_critic_inputs(obs, noise)
    assert torch.equal(vector[:, :3], noise_vector[:, :3])  # the same normalized state
    assert torch.equal(vector[:, 3:], decoded.flatten(1))
    assert torch.equal(noise_vector[:, 3:], noise.flatten(1))
    assert algo.critic.ensemble.net[0].weight.shape[1] == 3 + 3  # state + the 3-D decoded action
    assert algo.noise_critic.ensemble.net[0].weight.shape[1] == 3 + ACTION
    assert algo.target_entropy == -ACTION  # the actor's (noise) dimensions


def test_distillation_brings_the_noise_critic_to_the_action_critics_values():
    algo = aliased(critic_lr=3e-3)
    obs = batch()["obs"]
    probe = (torch.rand(6, 1, ACTION, generator=torch.Generator().manual_seed(3)) * 2 - 1) * BOUND

    def gap() -> float:
        with torch.no_grad():
            target = algo.critic(*algo.critic_inputs(obs, probe))
            return (algo.noise_critic(*algo.noise_critic_inputs(obs, probe)) - target).pow(2).mean().item()

    action_critic = [p.detach().clone() for p in algo.critic.parameters()]
    before = gap()
    for _ in range(300):
        metrics = algo.distill_step(obs)
    assert gap() < before / 10 and set(metrics) == {"distill_loss", "noise_q"}
    assert all(torch.equal(a, b) for a, b in zip(action_critic, algo.critic.parameters(), strict=True))


def test_the_actor_step_distils_then_climbs_the_noise_critic():
    algo = aliased()
    action_critic = [p.detach().clone() for p in algo.critic.parameters()]
    noise_critic = [p.detach().clone() for p in algo.noise_critic.parameters()]
    actor = [p.detach().clone() for p in algo.actor_parameters]
    metrics = algo.actor_step(batch())
    assert {"distill_loss", "actor_loss"} <= set(metrics)
    assert all(torch.equal(a, b) for a, b in zip(action_critic, algo.critic.parameters(), strict=True))
    distilled = algo.noise_critic.parameters()
    assert any(not torch.equal(a, b) for a, b in zip(noise_critic, distilled, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(actor, algo.actor_parameters, strict=True))
    # the actor's gradient comes from the noise critic: a noise critic that ignores the noise gives none
    flat = aliased()
    for module in flat.noise_critic.ensemble.net:
        if hasattr(module, "weight") and module.weight.dim() == 3:
            module.weight.data[:, 3:] = 0  # the first layer's noise columns
            break
    action, _ = flat.sample_actions(batch()["obs"])
    grad = torch.autograd.grad(flat.actor_q(batch()["obs"], action).sum(), action)[0]
    assert grad.abs().max() == 0


def test_the_buffer_keeps_the_executed_chunk_which_the_td_step_reads():
    algo = aliased()
    data = batch()
    stored = algo.stored_transitions(data.clone())
    assert torch.equal(stored["executed_action"], algo.decoder.decode(data["obs"], data["action"]))
    stored["executed_action"] = torch.zeros_like(stored["executed_action"])
    vector, _ = algo.replayed_critic_inputs(stored)
    assert vector[:, 3:].abs().max() == 0  # the stored chunk, not the noise decoded again


def test_update_decodes_and_state_round_trips():
    algo = aliased(utd=2)
    stored = algo.stored_transitions(batch())
    calls = algo.decoder.calls
    metrics = algo.update(lambda: stored, torch.Generator().manual_seed(0))
    assert {"critic_loss", "distill_loss", "noise_q", "actor_loss"} <= set(metrics)
    assert algo.decoder.calls - calls == 2 + 1  # each critic step's next noise, one distillation
    copy = aliased()
    copy.load_state_dict(algo.state_dict())
    data = batch()
    for name in ("critic", "noise_critic"):
        torch.testing.assert_close(
            getattr(copy, name)(*copy.noise_critic_inputs(data["obs"], data["action"]))
            if name == "noise_critic"
            else copy.critic(*copy.critic_inputs(data["obs"], data["action"])),
            getattr(algo, name)(*algo.noise_critic_inputs(data["obs"], data["action"]))
            if name == "noise_critic"
            else algo.critic(*algo.critic_inputs(data["obs"], data["action"])),
        )
    assert isinstance(algo, SAC)
