"""The pi0-style flow policy over the nano VLA: ratio == 1 with both heads, padded model chunks, prompts,
save/load, the prefix cache against a joint (uncached) forward, and a small SFT learning test."""

import numpy as np
import pytest
import torch

from embodrl.errors import ConfigError
from embodrl.policies.finetune import prepare_finetuning
from embodrl.policies.flow.vla_flow import discretize_state, make_prompts
from embodrl.policies.loading import load_policy
from tests.policies.vla_testing import LOGPROB_SHAPES, A, C, N, S, build, make_obs

VLA_FLOW = {"conditioning": "vla", "num_steps": 3}


@pytest.mark.parametrize("logprob_type", ["token", "chunk"])
@pytest.mark.parametrize("variant", ["pi0", "pi05"])
@pytest.mark.parametrize("likelihood", ["noise", "sde"])
def test_evaluate_recomputes_identical_logprobs(likelihood, variant, logprob_type):
    flow = {**VLA_FLOW, "likelihood": likelihood, "vla_variant": variant}
    policy = build("flow", logprob_type=logprob_type, flow=flow, value_obs_keys=["privileged"])
    obs = make_obs()
    out = policy.act(obs)
    assert out.actions.shape == (N, C, A) and out.logprob.shape == LOGPROB_SHAPES[logprob_type]
    ev = policy.evaluate(obs, out.replay)
    assert torch.equal(ev.logprob, out.logprob)  # ratio exactly 1
    assert torch.equal(ev.value, out.value) and ev.entropy.shape == (N,)
    ev.logprob.sum().backward()
    expert_grads = [p.grad for p in policy.action_expert.parameters() if p.grad is not None]
    assert expert_grads and any(g.abs().sum() > 0 for g in expert_grads)


def test_a_frozen_prefix_is_cached_for_the_update_and_gives_the_same_logprobs():
    policy = build("flow", flow=VLA_FLOW, train_expert_only=True, cache_frozen_prefix=True)
    prepare_finetuning(policy, policy.cfg)
    obs = make_obs()
    out = policy.act(obs)
    cache = out.replay["prefix_cache"]
    assert cache["keys"].shape[:2] == (N, policy.cfg.vla_architecture.language.num_layers)
    cached = policy.evaluate(obs, out.replay)
    recomputed = policy.evaluate(obs, out.replay.exclude("prefix_cache"))
    torch.testing.assert_close(cached.logprob, recomputed.logprob)
    torch.testing.assert_close(cached.logprob, out.logprob)
    cached.logprob.sum().backward()  # the expert trains from the cache alone
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.action_expert.parameters())
    trained = build("flow", flow=VLA_FLOW, cache_frozen_prefix=True)  # a prefix that trains: run again
    assert "prefix_cache" not in trained.act(obs).replay.keys()
    uncached = build("flow", flow=VLA_FLOW, train_expert_only=True)  # frozen, but the cache is opt-in
    prepare_finetuning(uncached, uncached.cfg)
    assert "prefix_cache" not in uncached.act(obs).replay.keys()


def test_padded_model_chunk_executes_its_first_steps_and_dims():
    policy = build("flow", flow={**VLA_FLOW, "action_horizon": 5, "max_action_dim": 6, "max_state_dim": 8})
    obs = make_obs()
    out = policy.act(obs)
    assert out.replay["chain"].shape == (N, 4, 5, 6) and out.actions.shape == (N, C, A)
    assert torch.equal(policy.evaluate(obs, out.replay).logprob, out.logprob)
    batch = make_obs()
    batch["action"] = torch.randn(N, C, A) * 0.3
    torch.manual_seed(0)
    loss = policy.sft_loss(batch)
    assert loss.dim() == 0 and loss.requires_grad
    with pytest.raises(ConfigError, match="smaller than"):
        build("flow", flow={**VLA_FLOW, "action_horizon": 1})


def test_save_then_load_gives_identical_outputs(tmp_path):
    policy = build("flow", flow={**VLA_FLOW, "vla_variant": "pi05"})
    policy.save_pretrained(tmp_path)
    loaded = load_policy(tmp_path)
    obs = make_obs()
    for deterministic in (True, False):
        torch.manual_seed(1)
        expected = policy.act(obs, deterministic=deterministic)
        torch.manual_seed(1)
        got = loaded.act(obs, deterministic=deterministic)
        assert torch.equal(got.actions, expected.actions) and torch.equal(got.logprob, expected.logprob)


def test_cached_prefix_gives_the_same_velocity_as_a_longer_padded_prompt():
    """Positions count real tokens and padding is masked, so extra prompt padding changes nothing."""
    short = build("flow", flow=VLA_FLOW)
    long = build(
        "flow",
        flow=VLA_FLOW,
        vla={"instructions": list(short.cfg.vla.instructions), "max_instruction_tokens": 40},
    )
    long.load_state_dict(short.state_dict())
    obs = make_obs()
    x, t = torch.randn(N, C, A), torch.rand(N)
    with torch.no_grad():
        torch.testing.assert_close(
            long.condition(obs)[1](x, t), short.condition(obs)[1](x, t), atol=1e-5, rtol=1e-5
        )


def test_pi05_prompts_discretize_the_state_like_numpy_digitize():
    state = torch.tensor([[-1.5, -1.0, -0.999, 0.0, 0.5, 0.99999, 1.0, 2.0]])
    expected = np.digitize(state.numpy(), bins=np.linspace(-1, 1, 257)[:-1]) - 1
    assert discretize_state(state).tolist() == expected.tolist()
    prompt = make_prompts("pi05", ["pick_up the cube\n"], state[:, :2])[0]
    assert prompt == "Task: pick up the cube, State: -1 0;\nAction: "
    assert make_prompts("pi0", [" push it "], None) == ["push it\n"]


@pytest.mark.slow
def test_nano_vla_flow_sft_loss_falls():
    assert S >= A
    policy = build("flow", obs_keys=("state",), flow=VLA_FLOW)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    torch.manual_seed(0)
    losses = []
    for step in range(60):
        batch = make_obs(32, seed=step)
        target = torch.tanh(0.5 * (batch["state"][:, :A] - 1.0))
        batch["action"] = target.unsqueeze(1).expand(32, C, A).clone()
        loss = policy.sft_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
    assert last < 0.6 * first, (first, last)
