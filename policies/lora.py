"""LoRA (via `peft`) or full fine-tuning, chosen per module group of a VLA policy, and merging it back.

Groups by parameter name: `vision` (vision towers + projector), `language` (the VLM's language model),
`action_head` (everything else the actor owns: LM head, action expert, slots, state projection). The
critic (`critic.`, `value_encoder.`) always trains. Adapters are injected in place
(`peft.inject_adapter_in_model`), so the policy keeps its class and its act/evaluate contract.

A LoRA checkpoint is a plain policy checkpoint whose model.safetensors holds the base weights, plus
adapter_config.json and adapter_model.safetensors: `load_policy` (loading.py) merges the adapters (eval,
serve, `policy.init_from`), `load_policy(..., merge_adapters=False)` keeps them trainable (resume), and
`embodrl convert merge-lora` writes the merged plain checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn

from embodrl.errors import UserError
from embodrl.policies.checkpoint import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, WEIGHTS_FILE
from embodrl.policies.lora_config import LoRAConfig

GROUP_PREFIXES = {
    # a VLA's vision towers, the instruction's FiLM of their features, and the projector; the CNN image
    # encoders of the MLP policies' ObsEncoder
    "vision": (
        "prefix_encoder.backbone.vision_towers.",
        "prefix_encoder.backbone.film.",
        "prefix_encoder.backbone.projector.",
        "encoder.images.",
    ),
    "language": ("prefix_encoder.backbone.language_model.",),
}
# The state token's projection into the language model: new in imported VLAs, so it trains with the head
# (also beside LoRA adapters), but policy.train_expert_only freezes it with the VLM: the whole prefix is
# then fixed and RL caches it.
VLM_STATE_INPUT_PREFIXES = ("prefix_encoder.backbone.state_projection.",)
CRITIC_PREFIXES = ("critic.", "value_encoder.")
LANGUAGE_LAYER = re.compile(r"prefix_encoder\.backbone\.language_model\.layers\.(\d+)\.")
LANGUAGE_NORM = "prefix_encoder.backbone.language_model.norm."
# Linear layers of the transformers ViTs / decoders (and pi0's expert) that receive adapters.
TARGET_LAYERS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "out_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "fc1",
    "fc2",
)


def group_of(name: str) -> str | None:
    """The module group of a parameter or module name; None for the critic."""
    if name.startswith(CRITIC_PREFIXES):
        return None
    for group, prefixes in GROUP_PREFIXES.items():
        if name.startswith(prefixes):
            return group
    return "action_head"


def first_trained_layer(policy: nn.Module, cfg: LoRAConfig) -> int:
    """The index of the lowest language-model layer that `policy.lora.language_layers` leaves to train (0:
    all of them, or the policy has no VLM)."""
    indices = {int(m.group(1)) for name, _ in policy.named_parameters() if (m := LANGUAGE_LAYER.match(name))}
    if not cfg.language_layers or not indices:
        return 0
    return max(0, max(indices) + 1 - cfg.language_layers)


def under_top_layers(name: str, first_trained: int) -> bool:
    """Whether parameter or module `name` feeds only the language model's layers under `first_trained`
    (those layers, the token embeddings, the state projection), which `policy.lora.language_layers`
    freezes."""
    if first_trained == 0:
        return False
    match = LANGUAGE_LAYER.match(name + ".")
    if match:
        return int(match.group(1)) < first_trained
    return (group_of(name) == "language" and not name.startswith(LANGUAGE_NORM)) or name.startswith(
        VLM_STATE_INPUT_PREFIXES
    )


def _target_regex(policy: nn.Module, cfg: LoRAConfig) -> str:
    """A regex (peft full-matches module names) selecting the target Linear layers of the LoRA groups."""
    first_trained = first_trained_layer(policy, cfg)
    names = [
        re.escape(name)
        for name, module in policy.named_modules()
        if isinstance(module, nn.Linear)
        and name.rsplit(".", 1)[-1] in TARGET_LAYERS
        and getattr(cfg, group_of(name) or "", None) == "lora"
        and not under_top_layers(name, first_trained)
    ]
    if not names:
        raise UserError(
            "LoRA was asked for but the chosen groups hold no target layers "
            f"({', '.join(TARGET_LAYERS)}); use mode 'full' for them instead"
        )
    return "^(" + "|".join(names) + ")$"


def apply_lora(policy: nn.Module, cfg: LoRAConfig) -> nn.Module:
    """Inject LoRA adapters into the "lora" groups and set requires_grad per group (and per
    `cfg.language_layers`), in place; the policy's config records `cfg` (policy.cfg.lora), so its
    checkpoints say how it is adapted."""
    first_trained = first_trained_layer(policy, cfg)
    if cfg.uses_lora:
        from peft import LoraConfig, inject_adapter_in_model

        peft_cfg = LoraConfig(
            r=cfg.rank,
            lora_alpha=cfg.alpha,
            lora_dropout=cfg.dropout,
            target_modules=_target_regex(policy, cfg),
        )
        inject_adapter_in_model(peft_cfg, policy)
    for name, param in policy.named_parameters():
        group = group_of(name)
        mode = "full" if group is None else getattr(cfg, group)
        trains = mode == "full" or (mode == "lora" and "lora_" in name)
        param.requires_grad_(trains and not under_top_layers(name, first_trained))
    policy.cfg = dataclasses.replace(policy.cfg, lora=cfg)
    return policy


def adapter_state_dict(policy: nn.Module) -> dict:
    """Only the LoRA adapter tensors (what a LoRA run needs to save besides the base checkpoint)."""
    return {k: v for k, v in policy.state_dict().items() if "lora_" in k}


def merge_lora(policy: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight (W + B A * alpha / r) and remove the peft wrappers, in place:
    the state dict gets its original names back, so the policy saves and loads like one never adapted."""
    from peft.tuners.lora import LoraLayer

    wrapped = [(name, module) for name, module in policy.named_modules() if isinstance(module, LoraLayer)]
    for name, module in wrapped:
        module.merge()
        parent_name, _, child = name.rpartition(".")
        setattr(policy.get_submodule(parent_name), child, module.get_base_layer())
    return policy


def save_lora_checkpoint(policy: nn.Module, cfg: LoRAConfig, directory: str | Path) -> None:
    """A policy checkpoint whose model.safetensors holds the base weights (loadable as the base policy),
    plus adapter_config.json and adapter_model.safetensors (merged by `embodrl convert merge-lora`)."""
    directory = Path(directory)
    policy.save_pretrained(directory)
    state = load_file(str(directory / WEIGHTS_FILE))
    base = {k.replace(".base_layer.", "."): v for k, v in state.items() if "lora_" not in k}
    save_file(base, str(directory / WEIGHTS_FILE))
    save_file({k: v for k, v in state.items() if "lora_" in k}, str(directory / ADAPTER_WEIGHTS_FILE))
    (directory / ADAPTER_CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(cfg), indent=2))


def save_policy(policy: nn.Module, directory: str | Path) -> None:
    """`policy.save_pretrained`, or a LoRA checkpoint (base weights + adapter files) if it holds adapters."""
    if adapter_state_dict(policy):
        save_lora_checkpoint(policy, policy.cfg.lora, directory)
    else:
        policy.save_pretrained(directory)
