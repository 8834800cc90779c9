"""Loading any family's checkpoint folder: config.json names the family, the registry gives its class.

A LoRA checkpoint (adapter_config.json beside the base weights, policies/lora.py) comes back with its
adapters merged into the weights, or injected and trainable to resume training.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from embodrl.errors import UserError
from embodrl.policies.base import Policy
from embodrl.policies.checkpoint import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, checkpoint_family
from embodrl.policies.lora import adapter_state_dict, apply_lora, merge_lora
from embodrl.policies.lora_config import LoRAConfig
from embodrl.policies.registry import policy_class


def load_policy(directory: str | Path, device: str = "cpu", merge_adapters: bool = True) -> Policy:
    """Load any family's checkpoint folder; config.json's "family" picks the class. A LoRA checkpoint comes
    back with its adapters merged into the weights (a plain policy), or with merge_adapters=False injected
    and trainable, as it was saved (to resume training)."""
    if not (Path(directory) / ADAPTER_CONFIG_FILE).is_file():
        return load_base_policy(directory, device)
    policy, _ = load_lora_checkpoint(directory, device)
    return merge_lora(policy) if merge_adapters else policy


def load_base_policy(directory: str | Path, device: str = "cpu") -> Policy:
    """The checkpoint's model.safetensors alone (of a LoRA checkpoint: the base weights, adapters ignored)."""
    return policy_class(checkpoint_family(directory)).from_pretrained(directory, device=device)


def load_lora_checkpoint(directory: str | Path, device: str = "cpu") -> tuple[Policy, LoRAConfig]:
    """Inverse of `save_lora_checkpoint`: the policy with its adapters injected (not merged)."""
    directory = Path(directory)
    if not (directory / ADAPTER_CONFIG_FILE).is_file():
        raise UserError(f"{directory} has no {ADAPTER_CONFIG_FILE}: it is not a LoRA checkpoint")
    cfg = LoRAConfig(**json.loads((directory / ADAPTER_CONFIG_FILE).read_text()))
    policy = apply_lora(load_base_policy(directory, device=device), cfg)
    adapters = load_file(str(directory / ADAPTER_WEIGHTS_FILE), device=str(device))
    missing = sorted(set(adapter_state_dict(policy)) - set(adapters))
    unexpected = sorted(set(adapters) - set(adapter_state_dict(policy)))
    if missing or unexpected:
        raise UserError(
            f"{ADAPTER_WEIGHTS_FILE} does not match {ADAPTER_CONFIG_FILE}: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]} (were the adapters saved from another policy?)"
        )
    policy.load_state_dict(adapters, strict=False)
    return policy, cfg
