"""The policy a training run starts from: built for its env or loaded from `policy.init_from`, then set up
for fine-tuning; shared by the SFT and RL runners."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from embodrl.config import ExperimentConfig
from embodrl.data.dataset_inputs import DatasetInputs
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


@dataclass(frozen=True)
class PolicySpace:
    """What a policy is built for: observation shapes, the action size, the instructions that `task_id`
    indexes, and what provides them (a simulator suite, or a dataset alone)."""

    observation_spec: Mapping
    action_dim: int
    instruction_table: tuple[str, ...]
    source: str  # for messages: "tabletop-basic", "dataset <folder>"
    dataset_features: dict[str, str] = field(default_factory=dict)  # empty when a simulator provides it

    @classmethod
    def of_env(cls, env: VecEnv, suite: str) -> PolicySpace:
        return cls(env.observation_spec, env.action_spec.dim, tuple(env.instruction_table), suite)

    @classmethod
    def of_dataset(cls, inputs: DatasetInputs, root: str) -> PolicySpace:
        return cls(inputs.shapes, inputs.action_dim, inputs.tasks, f"dataset {root}", inputs.features)


def read_prompts_through(policy: Policy, instructions: Sequence[str]) -> None:
    """Point a loaded checkpoint's instruction table at `instructions` (the env's, which obs["task_id"]
    indexes): a checkpoint from other tasks (a multi-task base, an import that knows no env) then reads the
    prompts this env means. A policy that embeds the ids themselves (it reads `task_id`) keeps its own."""
    table = tuple(instructions)
    if "task_id" in policy.cfg.read_keys or policy.cfg.instruction_table == table:
        return
    if policy.cfg.instruction_table:
        log.info("the checkpoint reads this env's %d instructions instead of its own", len(table))
    policy.set_instruction_table(table)


def build_policy(cfg: ExperimentConfig, env: VecEnv) -> Policy:
    """A fresh policy shaped for `env`, or the checkpoint named by `policy.init_from`; then the fine-tuning
    settings (policy.lora, train_expert_only, gradient_checkpointing) of the experiment are applied."""
    return build_policy_for(cfg, PolicySpace.of_env(env, cfg.env.suite))


def build_policy_for(cfg: ExperimentConfig, space: PolicySpace) -> Policy:
    """`build_policy` for what `space` describes (an env, or a dataset without a simulator)."""
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
        read_prompts_through(policy, space.instruction_table)
    else:
        pcfg = cfg.policy
        if space.dataset_features:  # the dataset says what the policy observes and how it acts
            pcfg = dataclasses.replace(
                pcfg, action_dim=space.action_dim, dataset_features=dict(space.dataset_features)
            )
        if "task_id" in pcfg.read_keys and pcfg.num_tasks == 0:
            pcfg = dataclasses.replace(pcfg, num_tasks=len(space.instruction_table))
        if not pcfg.instruction_table:  # language policies read instructions by task_id through this table
            pcfg = pcfg.with_instruction_table(space.instruction_table)
        policy = make_policy(pcfg, space.observation_spec, device=cfg.device)
        present = {group_of(name) for name, _ in policy.named_parameters()}
        kept = [g for g in GROUPS if g in present and getattr(cfg.policy.trained_groups, g) != "full"]
        if kept:
            log.warning(
                "the policy is built from scratch (no policy.init_from), so its %s weights stay at their "
                "random initialization (policy.lora / train_expert_only freeze them or put adapters on them)",
                " and ".join(kept),
            )
    if policy.cfg.action_dim != space.action_dim:
        raise UserError(
            f"the policy acts in {policy.cfg.action_dim} dims but {space.source} expects "
            f"{space.action_dim}; set policy.action_dim={space.action_dim}"
        )
    missing = [k for k in policy.cfg.read_keys if k not in space.observation_spec]
    if missing:
        raise UserError(
            f"the policy reads {missing} but {space.source} observes {list(space.observation_spec)}; "
            "change policy.obs_keys or env.obs_mode"
        )
    prepare_finetuning(policy, cfg.policy)  # in place
    return policy
