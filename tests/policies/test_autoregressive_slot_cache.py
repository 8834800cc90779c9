"""OFT decoding on a frozen VLA with policy.cache_frozen_prefix: the update reads the slots' hidden states."""

import dataclasses

import pytest
import torch

from embodrl.errors import UserError
from embodrl.policies.finetune import prepare_finetuning
from embodrl.policies.loading import load_policy
from tests.policies.vla_testing import A, C, N, build, make_obs

FROZEN_VLA = {
    "obs_keys": ("rgb", "state"),
    "autoregressive": {"decoding": "oft", "temperature": 1.3, "top_k": 40},
    "lora": {"vision": "frozen", "language": "frozen"},
    "train_expert_only": True,  # also freezes the state token's projection: the whole prefix is fixed
    "cache_frozen_prefix": True,
}


def frozen_oft_policy(**overrides):
    policy = build("autoregressive", **{**FROZEN_VLA, **overrides})
    return prepare_finetuning(policy, policy.cfg)


@pytest.mark.parametrize("value_obs_keys", [["privileged"], []])  # the critic's own encoder, or the actor's
def test_cached_slot_states_give_the_same_logprobs_and_values(value_obs_keys):
    policy = frozen_oft_policy(value_obs_keys=value_obs_keys)
    obs = make_obs()
    out = policy.act(obs)
    assert out.replay["slot_hidden"].shape == (N, C * A, policy.prefix_encoder.hidden_size)
    assert ("prefix_features" in out.replay.keys()) == (not value_obs_keys)
    cached = policy.evaluate(obs, out.replay)
    recomputed = policy.evaluate(obs, out.replay.exclude("slot_hidden", "prefix_features"))
    torch.testing.assert_close(cached.logprob, recomputed.logprob, atol=1e-5, rtol=0)
    torch.testing.assert_close(cached.logprob, out.logprob, atol=1e-5, rtol=0)
    torch.testing.assert_close(cached.value, recomputed.value, atol=1e-5, rtol=0)
    torch.testing.assert_close(cached.entropy, recomputed.entropy, atol=1e-5, rtol=0)


def test_a_step_on_the_cache_trains_the_action_rows_and_leaves_the_vla_fixed():
    policy = frozen_oft_policy(value_obs_keys=["privileged"])
    assert policy.lm_head.weight.requires_grad and policy.prefix_encoder.frozen
    obs = make_obs()
    out = policy.act(obs)
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(trainable, lr=1e-3)
    evaluated = policy.evaluate(obs, out.replay)
    (-evaluated.logprob.sum() + evaluated.value.square().sum()).backward()
    optimizer.step()
    changed = {name for name, p in policy.named_parameters() if not torch.equal(p, before[name])}
    frozen = {name for name, p in policy.named_parameters() if not p.requires_grad}
    assert any(name.startswith("prefix_encoder.backbone.language_model.") for name in frozen)
    assert not changed & frozen
    assert "lm_head.weight" in changed and any(name.startswith("critic.") for name in changed)
    first = policy.action_tokenizer.first_token
    rows_changed = (policy.lm_head.weight != before["lm_head.weight"]).any(-1)
    assert rows_changed[first:].any() and not rows_changed[:first].any()  # only action rows (top-k's kept)
    # a fresh act reads the trained rows: the log-prob of the same tokens rose
    assert policy.evaluate(obs, out.replay).logprob.sum() > evaluated.logprob.sum()


@pytest.mark.parametrize(
    "overrides",
    [
        {"train_expert_only": False},  # the state token's projection trains: the prefix changes
        {"autoregressive": {"decoding": "parallel"}},  # learned slots train
        {"cache_frozen_prefix": False},
    ],
)
def test_no_cache_when_the_slots_pass_can_change_or_it_is_off(overrides):
    policy = frozen_oft_policy(**overrides)
    replay = policy.act(make_obs()).replay
    assert "slot_hidden" not in replay.keys()


def test_a_slot_adapter_added_to_a_checkpoint_acts_as_before_then_trains_over_the_cache(tmp_path):
    sft = build("autoregressive", **{**FROZEN_VLA, "lora": {}, "train_expert_only": False})
    sft.save_pretrained(tmp_path / "sft")
    obs = make_obs()
    before = sft.act(obs, deterministic=True)
    rl_cfg = frozen_oft_policy(autoregressive={**FROZEN_VLA["autoregressive"], "slot_adapter": 32}).cfg
    policy = prepare_finetuning(load_policy(tmp_path / "sft"), rl_cfg)
    assert policy.cfg.autoregressive.slot_adapter == 32 and policy.prefix_encoder.frozen
    assert all(p.requires_grad for p in policy.slot_adapter.parameters())  # the action_head group
    out = policy.act(obs, deterministic=True)
    torch.testing.assert_close(out.actions, before.actions)  # zero output layer: the SFT policy unchanged
    torch.testing.assert_close(out.logprob, before.logprob)
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # the first step moves the zero output layer, the second also the hidden one
        optimizer.zero_grad()
        (-policy.evaluate(obs, out.replay).logprob.sum()).backward()
        optimizer.step()
    assert policy.slot_adapter[0].weight.grad.abs().sum() > 0
    assert policy.evaluate(obs, out.replay).logprob.sum() > out.logprob.sum()
    policy.save_pretrained(tmp_path / "rl")
    again = prepare_finetuning(load_policy(tmp_path / "rl"), sft.cfg)  # a run that asks for none keeps it
    assert again.cfg.autoregressive.slot_adapter == 32
    trained = policy.evaluate(obs, out.replay).logprob
    torch.testing.assert_close(again.evaluate(obs, out.replay).logprob, trained)
    narrower = dataclasses.replace(rl_cfg.autoregressive, slot_adapter=16)
    with pytest.raises(UserError, match="checkpoint's adapter is 32 wide"):
        prepare_finetuning(load_policy(tmp_path / "rl"), dataclasses.replace(rl_cfg, autoregressive=narrower))
