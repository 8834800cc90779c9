import pytest
import torch

from embodrl.config import compose, make_run_dir
from embodrl.errors import UserError
from embodrl.sims import registry
from embodrl.sims.registry import make_env
from embodrl.train.checkpointing import LAST, restore_checkpoint, rng_state, save_checkpoint
from embodrl.train.logger import read_metrics
from embodrl.train.rl_runner import OnPolicyRunner
from tests.engine import flaky_env
from tests.engine.helpers import make_policy, pendulum


def test_restore_checkpoint_loads_weights_and_rng_and_returns_the_trainer_state(tmp_path):
    cfg = pendulum()
    env = make_env(cfg.env)
    policy = make_policy(cfg, env)
    gen = torch.Generator().manual_seed(3)
    save_checkpoint(tmp_path / "ckpt", policy, {"step": 7, "rng": rng_state({"g": gen})})
    expected_draw = torch.rand(4, generator=gen)

    fresh = make_policy(cfg, env)
    env.close()
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)
    other = torch.Generator().manual_seed(99)
    state = restore_checkpoint(tmp_path / "ckpt", fresh, "cpu", {"g": other})
    assert state["step"] == 7
    for name, value in policy.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name
    assert torch.equal(torch.rand(4, generator=other), expected_draw)


def test_a_folder_without_trainer_state_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="not a training checkpoint"):
        restore_checkpoint(tmp_path, None, "cpu", {})


def test_the_env_restart_counter_survives_resume(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.SUITES, "flaky", "tests.engine.flaky_env:make_flaky")
    monkeypatch.setattr(flaky_env.FlakyVecEnv, "fail_at", 5)  # during the first rollout
    monkeypatch.setattr(flaky_env.FlakyVecEnv, "steps", 0)
    cfg = pendulum(f"run_root={tmp_path}", "env.suite=flaky", "train.iterations=1", "train.save_every=1")
    first = OnPolicyRunner(cfg, make_run_dir(cfg))
    first.learn()
    assert first.env_restarts == 1, "the fault was never injected"

    again = compose(str(first.run_dir / "config.yaml"), ["train.iterations=2"])
    resumed = OnPolicyRunner(again, first.run_dir, resume=True)
    assert resumed.env_restarts == 1
    resumed.learn()
    assert [r["engine/env_restarts"] for r in read_metrics(first.run_dir)] == [1.0, 1.0]
    assert (first.run_dir / LAST).is_dir()
