"""Few-shot SFT of the state flow policy on `pick`, then Flow-Noise PPO: RL must add success."""

import json

import pytest

from embodrl.cli import main
from embodrl.train.logger import read_metrics


@pytest.mark.slow
def test_few_shot_sft_flow_policy_gains_under_flow_noise_ppo(tmp_path):
    data = tmp_path / "demos"
    assert main(["collect", "pick_flow_noise", "--out", str(data), "--episodes-per-task", "5"]) == 0
    overrides = [
        f"run_root={tmp_path}",
        f"sft.dataset={data}",
        "sft.steps=1500",
        "train.iterations=80",
        "train.eval_every=0",
        "train.tensorboard=false",
    ]
    assert main(["train", "pick_flow_noise", *overrides]) == 0
    (run_dir,) = (tmp_path / "pick_flow_noise").iterdir()
    sft = json.loads((run_dir / "sft" / "final_eval.json").read_text())["success_rate"]
    rl = json.loads((run_dir / "final_eval.json").read_text())["eval/success"]
    rollouts = [row["rollout/success"] for row in read_metrics(run_dir) if "rollout/success" in row]
    # Measured (2026-12-02): SFT 43% -> RL 63% on the 100 fixed episodes, with 2 torch threads and with 1
    # (as in `make test`'s workers); stochastic rollouts, mean of the first and last 10 iterations:
    # 0.37 -> 0.59 (at 50 iterations RL was 51%: too close to the bound).
    assert 0.2 <= sft <= 0.7, sft  # a few-shot start with room to improve
    assert rl >= sft + 0.05, (sft, rl)
    assert sum(rollouts[-10:]) / 10 >= sum(rollouts[:10]) / 10 + 0.05, rollouts
