"""The chunk-latency benchmark on a small flow policy: every mode runs on the stand-in robot and seams
are found where new chunks start."""

import runpy
from pathlib import Path

import numpy as np
import pytest
import torch

from embodrl.policies.config import PolicyConfig
from embodrl.policies.registry import make_policy

SCRIPT = runpy.run_path(str(Path(__file__).resolve().parents[2] / "benchmarks" / "rtc_latency.py"))


def test_jumps_split_into_seams_and_the_steps_inside_chunks():
    sent = [np.array([0.0, 0, 1]), np.array([1.0, 0, 1]), np.array([1.0, 0, -1]), np.array([1.0, 3, -1])]
    seams, inside = SCRIPT["arm_jumps"](sent, seams=[0, 3], gripper_dim=-1)
    assert seams == [3.0] and inside == [1.0, 0.0]  # the gripper's switch at step 2 is left out


@pytest.mark.slow
def test_every_mode_runs_and_reports_its_seams(tmp_path):
    torch.manual_seed(0)
    cfg = PolicyConfig(family="flow", chunk_size=8, action_dim=7, obs_keys=("state",))
    make_policy(cfg, {"state": (22,)}).save_pretrained(tmp_path / "flow")
    argv = [str(tmp_path / "flow"), "--episodes", "1", "--latency-ms", "0", "--max-steps", "9", "--fps", "30"]
    rows = SCRIPT["main"](argv)
    assert [r["mode"] for r in rows] == ["open_loop", "blend", "rtc", "guided_rtc"]
    assert all(r["seams"] >= 1 and r["episodes"] == 1 and r["steps_mean"] == 9 for r in rows)


def test_seam_differences_are_paired_by_episode_and_skip_episodes_without_seams():
    guided = {"mode": "guided_rtc", "latency_ms": 100.0, "seam_jump_per_episode": [1.0, 2.0, None, 4.0]}
    blend = {"mode": "blend", "latency_ms": 100.0, "seam_jump_per_episode": [2.0, 2.0, 9.0, 6.0]}
    mean, stderr, n = SCRIPT["seam_difference"](guided, blend)
    assert n == 3 and mean == pytest.approx(-1.0)  # diffs -1, 0, -2: paired, episode 2 left out
    assert stderr == pytest.approx(np.std([-1.0, 0.0, -2.0], ddof=1) / np.sqrt(3))
    lines = SCRIPT["guided_differences"]([blend, guided])
    expected = "100 ms: guided_rtc - blend seam jump -1.000 +- 0.577 (paired standard error, 3 episodes)"
    assert lines == [expected]
