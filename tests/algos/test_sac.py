"""SAC's pieces on tiny inputs: the critic ensemble, the target, Polyak averaging, the temperature's sign."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from tensordict import TensorDict

from embodrl.algos import registry
from embodrl.algos.config import AlgoConfig
from embodrl.algos.sac import SAC, CriticEnsemble
from embodrl.errors import ConfigError, UserError
from embodrl.policies.config import PolicyConfig
from embodrl.policies.gaussian.configuration import GaussianConfig
from embodrl.policies.registry import make_policy

STATE, ACTION, BATCH = 3, 2, 6


def squashed_policy(squash: str = "tanh", obs_keys: tuple[str, ...] = ("state",)):
    cfg = PolicyConfig(
        family="gaussian",
        chunk_size=1,
        action_dim=ACTION,
        obs_keys=obs_keys,
        obs_clip=0.0,
        action_normalization="identity",
        gaussian=GaussianConfig(hidden_dims=(16,), squash=squash),
    )
    return make_policy(cfg, {"state": (STATE,), "rgb": (8, 8, 3), "task_id": ()})


def sac(**overrides) -> SAC:
    torch.manual_seed(0)
    cfg = AlgoConfig(name="sac", num_critics=4, critic_hidden_dims=(8,), **overrides)
    return SAC(squashed_policy(), cfg)


def batch(terminated: list[bool] | None = None) -> TensorDict:
    g = torch.Generator().manual_seed(1)
    return TensorDict(
        {
            "obs": {"state": torch.randn(BATCH, STATE, generator=g)},
            "action": torch.rand(BATCH, 1, ACTION, generator=g) * 2 - 1,
            "reward": torch.randn(BATCH, generator=g),
            "next_obs": {"state": torch.randn(BATCH, STATE, generator=g)},
            "terminated": torch.tensor(terminated or [False] * BATCH),
        },
        batch_size=[BATCH],
    )


def test_sac_is_an_off_policy_algorithm_of_the_registry():
    assert not AlgoConfig(name="sac").on_policy and AlgoConfig(name="ppo").on_policy
    assert registry.get("off_policy", "sac") is SAC
    with pytest.raises(ConfigError, match="critic_subset"):
        AlgoConfig(name="sac", num_critics=2, critic_subset=3)


def test_ensemble_members_differ_and_see_the_same_input():
    torch.manual_seed(0)
    critics = CriticEnsemble(5, 4, (8, 8))
    q = critics(torch.randn(3, 4))
    assert q.shape == (5, 3)
    assert len({round(v, 6) for v in q[:, 0].tolist()}) == 5  # independently initialized members


def test_target_is_reward_plus_discounted_soft_min_of_a_random_subset():
    algo = sac(gamma=0.9, critic_subset=2)
    data = batch(terminated=[True, False, True, False, False, False])
    torch.manual_seed(5)
    target = algo.critic_target(data, torch.Generator().manual_seed(3))
    # again by hand, with the same draws: the policy's sample, then the subset
    torch.manual_seed(5)
    action, logprob = algo.policy.sample_reparameterized(data["next_obs"])
    subset = torch.randperm(4, generator=torch.Generator().manual_seed(3))[:2]
    with torch.no_grad():
        q = algo.target(*algo.critic_inputs(data["next_obs"], action))
    soft = q[subset].min(0).values - algo.temperature * logprob.detach()
    expected = data["reward"] + 0.9 * (~data["terminated"]).float() * soft
    torch.testing.assert_close(target, expected)
    torch.testing.assert_close(target[[0, 2]], data["reward"][[0, 2]])  # an end bootstraps nothing
    assert not (q[subset].min(0).values == q.min(0).values).all()  # a pair, not all critics


def test_q_max_clips_the_targets_that_bootstrap_above_it():
    data = batch(terminated=[True, True, False, False, False, False])
    data["reward"] = torch.tensor([0.5, 1.0, 0.0, 0.0, 0.0, 0.0])
    algo = sac()
    with torch.no_grad():  # critics that overestimate by far: every Q(s', a') is 10
        algo.target.ensemble.net[-1].weight.zero_()
        algo.target.ensemble.net[-1].bias.fill_(10.0)
    torch.manual_seed(0)
    unclipped = algo.critic_target(data, torch.Generator().manual_seed(0))
    algo.cfg = dataclasses.replace(algo.cfg, q_max=1.0)
    torch.manual_seed(0)
    clipped = algo.critic_target(data, torch.Generator().manual_seed(0))
    assert unclipped[2:].min() > 5
    torch.testing.assert_close(clipped, unclipped.clamp(max=1.0))
    assert clipped[:2].tolist() == [0.5, 1.0]  # what does not exceed q_max stays


def test_critic_step_lowers_the_loss_and_moves_the_targets_by_tau():
    algo = sac(tau=0.25)
    data = batch(terminated=[True] * BATCH)  # fixed targets (the rewards): the regression must progress
    before = [p.detach().clone() for p in algo.target.parameters()]
    first = algo.critic_step(data, torch.Generator().manual_seed(0))["critic_loss"]
    critic = list(algo.critic.parameters())
    for old, new, target in zip(before, critic, algo.target.parameters(), strict=True):
        torch.testing.assert_close(target, 0.75 * old + 0.25 * new.detach())
    for _ in range(30):
        last = algo.critic_step(data, torch.Generator().manual_seed(0))["critic_loss"]
    assert last < first


@pytest.mark.parametrize("entropy_gap", [-1.0, 1.0])
def test_temperature_rises_when_the_entropy_is_below_its_target(entropy_gap):
    algo = sac(init_temperature=0.5)
    # entropy = -logprob; entropy_gap = entropy - target entropy
    logprob = torch.full((BATCH,), -(algo.target_entropy + entropy_gap))
    algo.temperature_optimizer.zero_grad()
    algo.temperature_loss(logprob).backward()
    algo.temperature_optimizer.step()
    moved = algo.temperature.item() - 0.5
    assert moved > 0 if entropy_gap < 0 else moved < 0


def test_actor_step_trains_the_actor_alone():
    algo = sac()
    critic = [p.detach().clone() for p in algo.critic.parameters()]
    actor = [p.detach().clone() for p in algo.actor_parameters]
    metrics = algo.actor_step(batch())
    assert set(metrics) == {"actor_loss", "entropy", "temperature"}
    assert all(torch.equal(a, b) for a, b in zip(critic, algo.critic.parameters(), strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(actor, algo.actor_parameters, strict=True))
    assert all(p.grad is None for p in algo.critic.parameters())


def test_update_runs_utd_critic_steps_per_actor_step():
    algo = sac(utd=3)
    drawn = []

    def sample() -> TensorDict:
        drawn.append(1)
        return batch()

    metrics = algo.update(sample, torch.Generator().manual_seed(0))
    assert len(drawn) == 3 and {"critic_loss", "actor_loss", "temperature"} <= set(metrics)
    assert algo.target_entropy == -ACTION and math.isclose(metrics["temperature"], 1.0, rel_tol=0.01)


def test_state_round_trip_restores_every_part():
    algo = sac()
    algo.update(lambda: batch(), torch.Generator().manual_seed(0))
    copy = sac()
    copy.load_state_dict(algo.state_dict())
    data = batch()
    torch.testing.assert_close(
        copy.critic(*copy.critic_inputs(data["obs"], data["action"])),
        algo.critic(*algo.critic_inputs(data["obs"], data["action"])),
    )
    assert copy.temperature == algo.temperature
    steps = [o.state_dict()["state"].keys() for o in (copy.critic_optimizer, algo.critic_optimizer)]
    assert steps[0] == steps[1] and len(steps[0]) > 0


def test_refusals_name_the_fix():
    with pytest.raises(UserError, match="frozen pretrained tower"):  # a CNN that trains: no cached features
        SAC(squashed_policy(obs_keys=("state", "rgb")), AlgoConfig(name="sac"))
    unsquashed = squashed_policy(squash="none")
    with pytest.raises(UserError, match="policy=gaussian_sac"):  # before any step is taken
        SAC(unsquashed, AlgoConfig(name="sac"))
    with pytest.raises(UserError, match="squash=tanh"):
        unsquashed.sample_reparameterized(batch()["obs"])


def test_bc_weight_pulls_the_actor_toward_the_demo_rows_actions_alone():
    data = batch()
    data["demo"] = torch.tensor([False, False, False, True, True, True])
    data["action"][:3] = 1.0  # what the online rows did must not be imitated
    algo = sac(bc_weight=10.0, actor_lr=1e-2)

    def distances() -> tuple[float, float]:
        with torch.no_grad():
            mean = algo.policy.act(data["obs"], deterministic=True).actions
        gap = (mean - data["action"]).pow(2).flatten(1).mean(1)
        return gap[3:].mean().item(), gap[:3].mean().item()

    demo_before, online_before = distances()
    for _ in range(50):
        metrics = algo.actor_step(data)
    demo_after, _ = distances()
    assert "bc_loss" in metrics and demo_after < demo_before / 2
    assert "bc_loss" not in sac().actor_step(data)  # off by default
    with pytest.raises(ConfigError, match="algo.bc_weight"):
        AlgoConfig(name="sac", bc_weight=-1.0)
