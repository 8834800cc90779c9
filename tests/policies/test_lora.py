"""LoRA per module group: what trains, merged forward equals the adapted one, names restored."""

import pytest
import torch

from embodrl.errors import ConfigError, UserError
from embodrl.policies.finetune import prepare_finetuning
from embodrl.policies.lora import LoRAConfig, adapter_state_dict, apply_lora, group_of, merge_lora
from tests.policies.vla_testing import build, make_obs


def _randomize_adapters(policy):
    # peft initialises B = 0 (the adapted model starts equal to the base); move it so merging matters
    torch.manual_seed(1)
    for name, param in policy.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.05)


def test_groups_choose_what_trains():
    policy = build("autoregressive", autoregressive={"decoding": "parallel"})
    apply_lora(policy, LoRAConfig(vision="frozen", language="lora", action_head="full", rank=4))
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert any("language_model" in n and "lora_A" in n for n in trainable)
    assert not any("language_model" in n and "lora_" not in n for n in trainable)  # base frozen
    assert not any(group_of(n) == "vision" for n in trainable)
    assert {"lm_head.weight", "slot_embeddings"} <= trainable
    assert any(n.startswith("critic.") for n in trainable)
    assert adapter_state_dict(policy) and all("lora_" in k for k in adapter_state_dict(policy))
    # the state token's projection is new in an imported VLA: it trains beside the language adapters
    assert any(n.startswith("prefix_encoder.backbone.state_projection.") for n in trainable)


def test_a_frozen_vlm_freezes_the_state_projection_into_it():
    policy = build("autoregressive", autoregressive={"decoding": "parallel"}, train_expert_only=True)
    prepare_finetuning(policy, policy.cfg)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert not any(n.startswith("prefix_encoder.") for n in trainable) and "lm_head.weight" in trainable


def test_merge_equals_the_adapted_forward_and_restores_names():
    policy = build("autoregressive", autoregressive={"decoding": "parallel"})
    names = set(policy.state_dict())
    apply_lora(policy, LoRAConfig(vision="lora", language="lora", rank=4, alpha=8.0))
    _randomize_adapters(policy)
    obs = make_obs()
    with torch.no_grad():
        adapted, _, _ = policy._parallel_logits(obs)
        merge_lora(policy)
        merged, _, _ = policy._parallel_logits(obs)
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=1e-5)
    assert set(policy.state_dict()) == names
    fresh = build("autoregressive", autoregressive={"decoding": "parallel"})
    base = fresh.state_dict()["prefix_encoder.backbone.language_model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(
        policy.state_dict()["prefix_encoder.backbone.language_model.layers.0.self_attn.q_proj.weight"], base
    )


def test_bad_lora_configs_are_refused():
    with pytest.raises(ConfigError, match="lora.language"):
        LoRAConfig(language="adapter")
    policy = build("autoregressive")
    with pytest.raises(UserError, match="no target layers"):
        apply_lora(policy, LoRAConfig(vision="frozen", language="frozen", action_head="lora"))
