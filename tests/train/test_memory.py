"""Memory estimate: 7B arithmetic, LoRA shrinking optimizer state, checkpointing shrinking activations."""

import dataclasses

import torch

from embodrl.policies.base import TransformerStack
from embodrl.policies.finetune import prepare_finetuning
from embodrl.policies.lora import LoRAConfig, apply_lora
from embodrl.policies.vla.configuration import PRESETS
from embodrl.policies.vla.modeling import VLABackbone
from embodrl.train.memory import GIB, estimate_memory, estimate_policy_memory, policy_stacks
from tests.policies.vla_testing import build


def test_openvla_7b_full_fine_tuning_in_fp32():
    arch = PRESETS["openvla-7b"]
    with torch.device("meta"):
        backbone = VLABackbone(arch, ("rgb",), state_dim=0)
    params = sum(p.numel() for p in backbone.parameters()) + 4096 * 32064  # + LM head
    lm = arch.language
    stack = TransformerStack(256 + 64 + 7, lm.hidden_size, lm.intermediate_size, lm.num_layers)
    estimate = estimate_memory(params, params, [stack], micro_batch=8)
    assert 27.5 * 1e9 < estimate.param_bytes < 31 * 1e9  # 7.5B x 4 bytes ~ 28-30 GB
    assert estimate.optimizer_bytes == 2 * estimate.param_bytes  # Adam's two fp32 moments
    assert estimate.grad_bytes == estimate.param_bytes
    checkpointed = estimate_memory(params, params, [stack], micro_batch=8, gradient_checkpointing=True)
    assert checkpointed.activation_bytes < estimate.activation_bytes / 5
    assert 0.5 < estimate.activation_bytes / GIB < 20  # a few GiB for 8 x 327 tokens in bf16
    assert "total" in estimate.report() and "GiB" in estimate.report()
    assert "7.5" in estimate.report().splitlines()[0] and "B" in estimate.report().splitlines()[0]


def test_report_counts_small_policies_in_millions_and_thousands():
    small = estimate_memory(3_100_000, 52_100, [], micro_batch=1).report()
    assert "3.10M" in small and "52.10K trainable" in small


def test_lora_keeps_params_but_shrinks_gradients_and_optimizer_state():
    policy = build("autoregressive")
    full = estimate_policy_memory(policy, micro_batch=4)
    apply_lora(policy, LoRAConfig(vision="frozen", language="lora", action_head="frozen", rank=2))
    lora = estimate_policy_memory(policy, micro_batch=4)
    assert lora.parameters > full.parameters  # adapters add a little
    assert lora.trainable < full.trainable / 3 and lora.optimizer_bytes < full.optimizer_bytes / 3
    # the frozen vision towers keep no activations; the adapted language model does
    assert 0 < lora.activation_bytes < full.activation_bytes
    assert estimate_policy_memory(policy, micro_batch=8).activation_bytes == 2 * lora.activation_bytes


def test_a_frozen_vlm_keeps_no_activations_only_the_action_expert_does():
    policy = build("flow", flow={"conditioning": "vla", "num_steps": 3})
    full = estimate_policy_memory(policy, micro_batch=4)
    expert_only = dataclasses.replace(policy.cfg, train_expert_only=True)
    prepare_finetuning(policy, expert_only)
    frozen = estimate_policy_memory(policy, micro_batch=4)
    (expert,) = policy_stacks(policy)
    assert expert.tokens == policy.model_shape[0] + 1  # horizon + state token
    assert expert.layers == len(policy.action_expert.layers) * 3  # one pass per Euler step
    assert 0 < frozen.activation_bytes < full.activation_bytes / 5
    assert frozen.trainable < full.trainable
