"""OFT decoding on a frozen VLA with policy.cache_frozen_prefix: the update reads the slots' hidden states."""

import pytest
import torch

from embodrl.policies.finetune import prepare_finetuning
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
