"""`embodrl train` as one command: optional SFT from demonstrations, then RL from the SFT policy (on-policy,
or from a replay buffer: AlgoConfig.on_policy picks the runner)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from embodrl.config import ExperimentConfig
from embodrl.policies.lora_config import LoRAConfig
from embodrl.train.checkpointing import LAST, POLICY_DIR
from embodrl.train.offpolicy_runner import OffPolicyRunner
from embodrl.train.rl_runner import OnPolicyRunner
from embodrl.train.runner import FINAL_EVAL_FILE

SFT_DIR = "sft"


def sft_stage(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config of the SFT stage: every weight trains. It starts from random weights, which freezing or
    LoRA would keep random; `policy.lora` and `train_expert_only` apply to the RL stage, from SFT's result."""
    policy = dataclasses.replace(cfg.policy, lora=LoRAConfig(), train_expert_only=False)
    return dataclasses.replace(cfg, policy=policy)


def train(cfg: ExperimentConfig, run_dir: Path, resume: bool = False) -> dict:
    """SFT into run_dir/sft/ first when `sft.dataset` is set and no `policy.init_from` is given; then RL.

    On --resume a finished SFT stage is kept and an unfinished one continues from its checkpoint.
    Returns the RL run's final evaluation, plus `sft/success` when an SFT stage ran.
    """
    summary: dict = {}
    if cfg.sft.dataset and not cfg.policy.init_from:
        from embodrl.train.sft_runner import SFTRunner

        sft_dir = run_dir / SFT_DIR
        if not (sft_dir / FINAL_EVAL_FILE).is_file():  # the SFT stage has not finished
            sft_dir.mkdir(parents=True, exist_ok=True)
            # resumes from sft/checkpoints/last, recovering an interrupted save; starts over without one
            SFTRunner(sft_stage(cfg), sft_dir, resume=resume).learn()
            resume = False  # RL has not started yet
        summary["sft/success"] = json.loads((sft_dir / FINAL_EVAL_FILE).read_text())["success_rate"]
        policy = dataclasses.replace(cfg.policy, init_from=str(sft_dir / LAST / POLICY_DIR))
        cfg = dataclasses.replace(cfg, policy=policy)
    runner = OnPolicyRunner if cfg.algo.on_policy else OffPolicyRunner
    summary.update(runner(cfg, run_dir, resume=resume).learn())
    return summary
