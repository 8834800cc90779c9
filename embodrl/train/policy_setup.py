"""The policy a training run starts from: built for its env or loaded from `policy.init_from`, then set up
for fine-tuning; shared by the SFT and RL runners."""

from __future__ import annotations

import dataclasses
import logging

from embodrl.config import ExperimentConfig
from embodrl.errors import UserError
from embodrl.policies.base import Policy
from embodrl.policies.config import overridden_by_checkpoint
from embodrl.policies.finetune import prepare_finetuning
from embodrl.policies.loading import load_policy
from embodrl.policies.lora import group_of
from embodrl.policies.lora_config import GROUPS
from embodrl.policies.registry import make_policy
from embodrl.sims.base import VecEnv

log = logging.getLogger(__name__)


def read_prompts_through(policy: Policy, env: VecEnv) -> None:
    """Point a loaded checkpoint's instruction table at `env`'s, which obs["task_id"] indexes: a checkpoint
    from other tasks (a multi-task base, an import that knows no env) then reads the prompts this env
    means. A policy that embeds the ids themselves (it reads `task_id`) keeps its own table."""
    table = tuple(env.instruction_table)
    if "task_id" in policy.cfg.read_keys or policy.cfg.instruction_table == table:
        return
    if policy.cfg.instruction_table:
        log.info("the checkpoint reads this env's %d instructions instead of its own", len(table))
    policy.set_instruction_table(table)


def build_policy(cfg: ExperimentConfig, env: VecEnv) -> Policy:
    """A fresh policy shaped for `env`, or the checkpoint named by `policy.init_from`; then the fine-tuning
    settings (policy.lora, train_expert_only, gradient_checkpointing) of the experiment are applied."""
    if cfg.policy.init_from:
        policy = load_policy(cfg.policy.init_from, device=cfg.device)
        ignored = overridden_by_checkpoint(cfg.policy, policy.cfg)
        if ignored:  # e.g. a likelihood setting given with an SFT checkpoint built for another one
            log.warning(
                "policy.init_from=%s keeps the checkpoint's own policy settings; these experiment settings "
                "are not applied: %s",
                cfg.policy.init_from,
                ", ".join(ignored),
            )
        read_prompts_through(policy, env)
    else:
        pcfg = cfg.policy
        if "task_id" in pcfg.read_keys and pcfg.num_tasks == 0:
            pcfg = dataclasses.replace(pcfg, num_tasks=len(env.instruction_table))
        if not pcfg.instruction_table:  # language policies read instructions by task_id through this table
            pcfg = pcfg.with_instruction_table(env.instruction_table)
        policy = make_policy(pcfg, env.observation_spec, device=cfg.device)
        present = {group_of(name) for name, _ in policy.named_parameters()}
        kept = [g for g in GROUPS if g in present and getattr(cfg.policy.trained_groups, g) != "full"]
        if kept:
            log.warning(
                "the policy is built from scratch (no policy.init_from), so its %s weights stay at their "
                "random initialization (policy.lora / train_expert_only freeze them or put adapters on them)",
                " and ".join(kept),
            )
    if policy.cfg.action_dim != env.action_spec.dim:
        raise UserError(
            f"the policy acts in {policy.cfg.action_dim} dims but {cfg.env.suite} expects "
            f"{env.action_spec.dim}; set policy.action_dim={env.action_spec.dim}"
        )
    missing = [k for k in policy.cfg.read_keys if k not in env.observation_spec]
    if missing:
        raise UserError(
            f"the policy reads {missing} but the env observes {list(env.observation_spec)}; "
            "change policy.obs_keys or env.obs_mode"
        )
    prepare_finetuning(policy, cfg.policy)  # in place
    return policy
