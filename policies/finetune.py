"""Fine-tuning settings applied to a built or loaded policy: full / LoRA / frozen per module group (with the
frozen-VLM shortcut `policy.train_expert_only`, pi_RL's recipe) and activation checkpointing of the
`transformers` towers (`policy.gradient_checkpointing`), how RL groups the log-probs
(`policy.logprob_type`) and a family's RUN_SETTINGS (how rollouts sample, e.g. the token temperature, and
modules a run adds, e.g. the token VLA's slot adapter).

They are training settings, read from the experiment config also when the policy comes from
`policy.init_from`, and recorded in the policy's config so its checkpoints say how it was trained.
"""

from __future__ import annotations

import dataclasses
import logging

from torch import nn

from embodrl.errors import UserError
from embodrl.policies.config import PolicyConfig, run_settings
from embodrl.policies.lora import VLM_STATE_INPUT_PREFIXES, apply_lora, group_of

log = logging.getLogger(__name__)

VLM_GROUPS = ("vision", "language")


def prepare_finetuning(policy: nn.Module, cfg: PolicyConfig) -> nn.Module:
    """Set what trains (and inject adapters) per `cfg.trained_groups`, turn on gradient checkpointing if
    asked, in place; returns the policy."""
    has_vlm = any(group_of(name) in VLM_GROUPS for name, _ in policy.named_parameters())
    if cfg.train_expert_only and not has_vlm:
        raise UserError(
            "policy.train_expert_only freezes a VLA's vision towers and language model, but this policy has "
            "none; set policy.train_expert_only=false"
        )
    family = policy.cfg.family
    own, wanted = getattr(policy.cfg, family), getattr(cfg, family)
    settings = {name: getattr(wanted, name) for name in run_settings(own)}
    if settings:
        policy.cfg = dataclasses.replace(policy.cfg, **{family: dataclasses.replace(own, **settings)})
    policy.adopt_run_settings()  # before the groups are set: a module it adds trains or freezes with them
    apply_lora(policy, cfg.trained_groups)
    if cfg.train_expert_only:
        for name, param in policy.named_parameters():
            if name.startswith(VLM_STATE_INPUT_PREFIXES):
                param.requires_grad_(False)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
    prefix = getattr(policy, "prefix_encoder", None)
    if cfg.cache_frozen_prefix and prefix is not None and not policy.caches_frozen_prefix_part():
        training = sorted({name.split(".")[1] for name, p in prefix.named_parameters() if p.requires_grad})
        log.warning(
            "policy.cache_frozen_prefix caches only a frozen prefix, and %s of it train here: every update "
            "reruns it (freeze it with policy.train_expert_only=true, or, on the token VLA, freeze the "
            "vision towers and train only the language model's top layers: policy.lora.language_layers)",
            ", ".join(training),
        )
    policy.cfg = dataclasses.replace(
        policy.cfg,
        train_expert_only=cfg.train_expert_only,
        gradient_checkpointing=cfg.gradient_checkpointing,
        cache_frozen_prefix=cfg.cache_frozen_prefix,
        logprob_type=cfg.logprob_type,
        sft_aux_weight=cfg.sft_aux_weight,
    )
    return policy


def enable_gradient_checkpointing(policy: nn.Module) -> list[str]:
    """Turn on activation checkpointing in every `transformers` model of the policy that supports it (a
    family opts a model out when it reads that model's KV cache with gradients); returns their names."""
    from transformers import PreTrainedModel

    names = [
        name
        for name, module in policy.named_modules()
        if isinstance(module, PreTrainedModel) and module.supports_gradient_checkpointing
    ]
    if not names:
        raise UserError(
            "policy.gradient_checkpointing recomputes the activations of a VLA's transformers towers, but "
            "this policy has none; set policy.gradient_checkpointing=false"
        )
    for name in names:
        policy.get_submodule(name).activation_checkpointing_enable()
    return names
