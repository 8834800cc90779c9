"""scripts/intervention_triggers.py: how often each takeover rule would trip on a policy left to act."""

import re
import runpy
from pathlib import Path

import torch

from embodrl.config import compose, to_yaml
from embodrl.policies.registry import make_policy
from embodrl.sims.registry import make_env

SCRIPT = Path(__file__).parents[2] / "scripts" / "intervention_triggers.py"
script = runpy.run_path(str(SCRIPT))


def test_a_policy_that_holds_still_trips_the_stall_rule_every_patience_decisions(tmp_path, capsys):
    overrides = ["env.obs_mode=state", "env.control_mode=ee_delta_pos", "env.wrist_camera=false"]
    overrides += ["env.max_episode_steps=20", "policy.obs_keys=[state]", "intervention.patience=4"]
    cfg = compose("pick_image_sac", overrides)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(cfg))
    env = make_env(cfg.env)
    policy = make_policy(cfg.policy, {k: spec.shape for k, spec in env.observation_spec.items()})
    with torch.no_grad():  # the mean action: no motion, gripper open (the last element's bias, squashed)
        for p in policy.parameters():
            p.zero_()
        policy.actor[-1].bias[3] = -3.0  # outputs: the 4 means, then the 4 log-stds
    policy.save_pretrained(run / "checkpoints" / "last" / "policy")
    assert script["main"]([str(run / "checkpoints" / "last" / "policy"), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    # 20 decisions: the first sets the headway, then a trip every 4 decisions without any
    assert re.findall(r"stall (\d+) \(", out) == ["4", "4"]
    assert "failures (2): trips per episode" in out
