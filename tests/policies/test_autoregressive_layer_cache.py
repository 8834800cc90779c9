"""OFT decoding where only the language model's top layers train (policy.lora.language_layers) above frozen
vision towers, with policy.cache_frozen_prefix: the update reruns the top layers on states stored in
replay."""

import pytest
import torch

from embodrl.policies.finetune import prepare_finetuning
from tests.policies.vla_testing import N, build, make_obs

TOP_LAYERS = {
    "obs_keys": ("rgb", "state"),
    "autoregressive": {"decoding": "oft", "temperature": 1.3, "top_k": 40},
    "lora": {"vision": "frozen", "language_layers": 1},
    "cache_frozen_prefix": True,
}
LM = "prefix_encoder.backbone.language_model."


def top_layer_policy(**overrides):
    policy = build("autoregressive", **{**TOP_LAYERS, **overrides})
    return prepare_finetuning(policy, policy.cfg)


def num_layers(policy) -> int:
    return policy.backbone.language_model.config.num_hidden_layers


def test_language_layers_freeze_what_lies_under_the_top_layers():
    policy = top_layer_policy()
    top = num_layers(policy) - 1
    trained = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert any(name.startswith(f"{LM}layers.{top}.") for name in trained)
    assert f"{LM}norm.weight" in trained and "lm_head.weight" in trained
    under = [
        f"{LM}layers.{top - 1}.",
        f"{LM}embed_tokens.",
        "prefix_encoder.backbone.state_projection.",
        "prefix_encoder.backbone.projector.",
    ]
    for prefix in under:
        assert not any(name.startswith(prefix) for name in trained), prefix
    assert policy.cached_layer == top and policy.caches_frozen_prefix_part()


@pytest.mark.parametrize("value_obs_keys", [["privileged"], []])  # the critic's own encoder, or the actor's
def test_cached_layer_states_give_the_same_logprobs_and_values(value_obs_keys):
    policy = top_layer_policy(value_obs_keys=value_obs_keys)
    obs = make_obs()
    out = policy.act(obs)
    hidden = policy.prefix_encoder.hidden_size
    assert out.replay["layer_input"].shape[::2] == (N, hidden)
    cached = policy.evaluate(obs, out.replay)
    recomputed = policy.evaluate(obs, out.replay.exclude("layer_input", "layer_keys"))
    for got, want in [(cached, recomputed), (cached, out)]:
        torch.testing.assert_close(got.logprob, want.logprob, atol=1e-5, rtol=0)
        torch.testing.assert_close(got.value, want.value, atol=1e-5, rtol=0)
    torch.testing.assert_close(cached.entropy, recomputed.entropy, atol=1e-5, rtol=0)


def test_a_step_on_the_cache_trains_the_top_layer_and_leaves_the_bottom_fixed():
    # no top-k: a step must not push a sampled token out of the kept set
    policy = top_layer_policy(value_obs_keys=["privileged"], autoregressive={"decoding": "oft", "top_k": 0})
    obs = make_obs()
    out = policy.act(obs)
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    evaluated = policy.evaluate(obs, out.replay)
    (-evaluated.logprob.sum()).backward()
    optimizer.step()
    changed = {name for name, p in policy.named_parameters() if not torch.equal(p, before[name])}
    frozen = {name for name, p in policy.named_parameters() if not p.requires_grad}
    assert not changed & frozen
    assert any(name.startswith(f"{LM}layers.{num_layers(policy) - 1}.") for name in changed)
    assert policy.evaluate(obs, out.replay).logprob.sum() > evaluated.logprob.sum()
    # the cache still stands for the observation: the bottom did not move
    fresh = policy.act(obs).replay["layer_input"]
    torch.testing.assert_close(fresh, out.replay["layer_input"])


@pytest.mark.parametrize(
    "overrides",
    [
        {"lora": {"vision": "full", "language_layers": 1}},  # the towers train under the top layers
        {"lora": {"vision": "frozen"}},  # every layer trains
        {"autoregressive": {"decoding": "parallel"}},  # learned slots: not the OFT layout
        {"cache_frozen_prefix": False},
    ],
)
def test_no_layer_cache_when_something_under_the_top_trains_or_it_is_off(overrides):
    policy = top_layer_policy(**overrides)
    assert "layer_input" not in policy.act(make_obs()).replay.keys()


def test_lora_on_the_top_layers_only():
    policy = top_layer_policy(lora={"vision": "frozen", "language": "lora", "language_layers": 1, "rank": 4})
    adapters = {name for name, _ in policy.named_parameters() if "lora_" in name}
    top = num_layers(policy) - 1
    assert adapters and all(name.startswith(f"{LM}layers.{top}.") for name in adapters)
    out = policy.act(make_obs())
    assert "layer_input" in out.replay.keys()
    logprob = policy.evaluate(make_obs(), out.replay).logprob
    torch.testing.assert_close(logprob, out.logprob, atol=1e-5, rtol=0)
