"""scripts/probe_image_features.py: the linear probe on a checkpoint's image features."""

import runpy
from pathlib import Path

import pytest

from embodrl.cli import main as cli
from embodrl.config import compose
from embodrl.sims.registry import make_env
from embodrl.train.policy_setup import build_policy

SCRIPT = Path(__file__).parents[2] / "scripts" / "probe_image_features.py"
probe = runpy.run_path(str(SCRIPT))["main"]


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    for name, first in (("fit", "0"), ("unseen", "500")):
        args = ["collect", "pick_image_dppo", "env.num_envs=2", "--out", str(root / name)]
        assert cli([*args, "--episodes-per-task", "2", "--first-state", first]) == 0
    return root


@pytest.mark.parametrize("policy", ["flow_state", "flow_vla_nano"])
def test_probe_reads_the_policy_image_encoder_and_scores_both_datasets(demos, tmp_path, capsys, policy):
    overrides = ["env.num_envs=1", f"policy={policy}", "policy.family=flow", "policy.obs_keys=[rgb,state]"]
    cfg = compose("pick_image_dppo", overrides)
    env = make_env(cfg.env)
    build_policy(cfg, env).save_pretrained(tmp_path / "policy")
    env.close()
    common = [str(tmp_path / "policy"), "--train", str(demos / "fit"), "--test", str(demos / "unseen")]
    results = probe([*common, "--lambdas", "0.001", "1000"])
    features = 128 if policy == "flow_state" else 64 * 128  # CNN output; the VLA's 64 patch tokens
    assert f"unseen, {features} features" in capsys.readouterr().out
    assert set(results) == {0.001, 1000.0} and all(len(r["unseen"]) == 4 for r in results.values())
    # more features than frames: an almost unregularised probe fits the frames it saw, not the others
    assert min(results[0.001]["fitted"]) > 0.99 > max(results[0.001]["unseen"])
    untrained = probe([*common, "--reinit", "--lambdas", "1000"])  # other weights: other features
    assert untrained[1000.0] != results[1000.0]
    pixels = probe([*common, "--features", "pixels", "--lambdas", "0.001"])
    assert min(pixels[0.001]["fitted"]) > 0.99
    capsys.readouterr()
    conditioned = probe([*common, "--features", "condition", "--lambdas", "1000"])  # image + state (+ text)
    assert len(conditioned[1000.0]["unseen"]) == 4 and conditioned[1000.0] != results[1000.0]
    assert f"unseen, {features} features" not in capsys.readouterr().out
    probe([*common, "--first-frames", "1", "--lambdas", "1000"])  # 2 demos each: their first frames
    assert "2 frames fitted, 2 unseen" in capsys.readouterr().out


def test_probe_scores_a_pretrained_tower_without_a_checkpoint(demos, capsys):
    common = ["--train", str(demos / "fit"), "--test", str(demos / "unseen"), "--lambdas", "1000"]
    results = probe(["--tower", "efficientnet-lite0", "--blocks", "5", *common])
    assert "unseen, 2560 features" in capsys.readouterr().out  # 40 channels x 8 x 8 cells of a 64 px image
    assert len(results[1000.0]["unseen"]) == 4
    deeper = probe(["--tower", "efficientnet-lite0", "--blocks", "8", *common])
    assert "unseen, 1280 features" in capsys.readouterr().out and deeper != results  # 80 x 4 x 4
    with pytest.raises(SystemExit):  # argparse: blocks of another tower are not choices
        probe(["--tower", "resnet", *common])
