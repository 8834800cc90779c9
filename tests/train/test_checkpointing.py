import pickle
import shutil

import pytest
import torch

from embodrl.config import compose, make_run_dir
from embodrl.errors import UserError
from embodrl.sims import registry
from embodrl.sims.registry import make_env
from embodrl.train.checkpointing import (
    LAST,
    MANIFEST_FILE,
    restore_checkpoint,
    rng_state,
    save_checkpoint,
    write_manifest,
)
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


def _saved(tmp_path, step: int):
    """A pendulum policy saved as checkpoint `tmp_path/last` with trainer state {'step': step}."""
    cfg = pendulum()
    env = make_env(cfg.env)
    policy = make_policy(cfg, env)
    env.close()
    save_checkpoint(tmp_path / "last", policy, {"step": step, "rng": rng_state({})})
    return policy


@pytest.mark.parametrize(
    "interrupted",
    ["after the first rename", "after both renames", "while removing .old", "while writing .tmp"],
)
def test_a_save_killed_at_any_point_leaves_a_checkpoint_that_resumes_and_saves_again(tmp_path, interrupted):
    """kill -9 during the swap once left a non-empty last.old that broke every later save, or no `last`."""
    policy = _saved(tmp_path, 1)
    last, tmp, old = tmp_path / "last", tmp_path / "last.tmp", tmp_path / "last.old"
    shutil.copytree(last, tmp)  # a second, newer save, complete in .tmp
    state = torch.load(last / "trainer_state.pt", weights_only=True)
    torch.save({**state, "step": 2}, tmp / "trainer_state.pt")
    write_manifest(tmp)
    expected = {"after the first rename": 2, "after both renames": 2, "while removing .old": 2}
    if interrupted == "after the first rename":
        last.rename(old)
    elif interrupted == "after both renames":
        last.rename(old)
        tmp.rename(last)
    elif interrupted == "while removing .old":
        last.rename(old)
        tmp.rename(last)
        (old / "trainer_state.pt").unlink()  # half deleted
    else:  # .tmp lacks its manifest: the old `last` stays
        (tmp / MANIFEST_FILE).unlink()
        expected[interrupted] = 1
    state = restore_checkpoint(last, policy, "cpu", {})
    assert state["step"] == expected[interrupted]
    assert not tmp.exists() and not old.exists()
    save_checkpoint(last, policy, {"step": 3, "rng": rng_state({})})  # later saves work
    assert restore_checkpoint(last, policy, "cpu", {})["step"] == 3


def test_a_damaged_checkpoint_is_named_and_trainer_state_loads_without_pickled_code(tmp_path):
    policy = _saved(tmp_path, 1)
    last = tmp_path / "last"
    with (last / "policy" / "model.safetensors").open("r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    with pytest.raises(UserError, match="damaged: policy/model.safetensors differs from its checksum"):
        restore_checkpoint(last, policy, "cpu", {})

    class Payload:
        def __reduce__(self):
            return (print, ("code ran",))

    _saved(tmp_path, 1)
    torch.save({"step": 1, "rng": rng_state({}), "x": Payload()}, last / "trainer_state.pt")
    (last / MANIFEST_FILE).unlink()  # as a checkpoint from before manifests
    with pytest.raises(pickle.UnpicklingError):
        restore_checkpoint(last, policy, "cpu", {})
