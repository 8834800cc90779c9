import json
import logging
import os
import signal

import pytest
import torch

from embodrl.config import compose, make_run_dir
from embodrl.errors import Terminated, UserError
from embodrl.policies.loading import load_policy
from embodrl.train.checkpointing import LAST, restore_checkpoint
from embodrl.train.logger import read_metrics
from embodrl.train.rl_runner import OnPolicyRunner
from tests.pendulum import pendulum

# The shared pendulum, with longer episodes, wider nets and a one-iteration critic warm-up
RUNNER = [
    "env.max_episode_steps=50",
    "policy.gaussian.hidden_dims=[32,32]",
    "policy.value_hidden_dims=[32,32]",
    "algo.minibatch_size=64",
    "algo.critic_warmup_iters=1",
    "train.eval_every=2",
    "train.eval_episodes=4",
]
# Every CleanRL detail on: running obs normalization, reward scaling, per-minibatch advantages, linear lr
CLEANRL = [
    "algo.obs_normalization=true",
    "algo.reward_scaling=true",
    "algo.normalize_advantages=minibatch",
    "algo.lr_schedule=linear",
    "policy.gaussian.init=orthogonal",
]


def _runner(tmp_path, *overrides, resume_dir=None):
    if resume_dir is not None:
        return OnPolicyRunner(
            compose(str(resume_dir / "config.yaml"), list(overrides)), resume_dir, resume=True
        )
    cfg = pendulum(*RUNNER, f"run_root={tmp_path}", *overrides)
    return OnPolicyRunner(cfg, make_run_dir(cfg))


def test_training_writes_metrics_checkpoint_curve_and_ratio_is_one(tmp_path):
    runner = _runner(tmp_path, "train.iterations=3")
    final = runner.learn()
    rows = read_metrics(runner.run_dir)
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    # The critic-only warm-up leaves the actor alone; afterwards the first minibatch has ratio 1 exactly.
    assert rows[0]["train/critic_only"] == 1.0 and rows[1]["train/critic_only"] == 0.0
    assert all(r["train/ratio0_maxdev"] < 1e-5 for r in rows)
    assert "eval/success" in rows[1] and 0.0 <= final["eval/success"] <= 1.0
    assert (runner.run_dir / LAST / "policy" / "config.json").is_file()
    assert (runner.run_dir / "learning_curve.png").stat().st_size > 0
    assert (runner.run_dir / "videos").is_dir()
    assert (
        json.loads((runner.run_dir / "final_eval.json").read_text())["eval/success"] == final["eval/success"]
    )


def test_train_videos_sets_how_many_final_episodes_are_recorded(tmp_path):
    one = _runner(tmp_path / "one", "train.iterations=1", "train.eval_every=0", "train.videos=1")
    one.learn()
    assert [p.name for p in (one.run_dir / "videos").iterdir()] == ["episode_000.mp4"]
    none = _runner(tmp_path / "none", "train.iterations=1", "train.eval_every=0", "train.videos=0")
    none.learn()
    assert not (none.run_dir / "videos").exists()


ASYNC_SYNCHRONOUS = ["engine.schedule=async", "engine.max_staleness=0"]


PIPELINED = ["engine=pipelined"]


@pytest.mark.parametrize(
    "options", [[], CLEANRL, ASYNC_SYNCHRONOUS, PIPELINED], ids=["plain", "cleanrl", "async-s0", "pipelined"]
)
def test_resume_reproduces_the_next_iteration_exactly(tmp_path, options):
    """Also with running obs/reward statistics and the linear lr schedule, which the checkpoint carries."""
    straight = _runner(tmp_path / "a", "train.iterations=3", "train.save_every=1", *options)
    straight.learn()
    expected = read_metrics(straight.run_dir)[-1]

    interrupted = _runner(tmp_path / "b", "train.iterations=3", "train.save_every=1", *options)
    iterate, calls = interrupted._iterate, []

    def crash_in_the_third_iteration():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("crash")
        return iterate()

    interrupted._iterate = crash_in_the_third_iteration
    with pytest.raises(RuntimeError, match="crash"):
        interrupted.learn()
    resumed = _runner(tmp_path / "b", resume_dir=interrupted.run_dir)
    assert resumed.iteration == 2
    resumed.learn()
    got = read_metrics(interrupted.run_dir)[-1]
    assert got["iteration"] == 3
    for key in (
        "train/policy_loss",
        "train/value_loss",
        "rollout/return",
        "train/approx_kl",
        "train/actor_lr",
    ):
        assert got[key] == expected[key], key
    for key in ("mean", "std"):
        assert torch.equal(
            getattr(resumed.policy.normalizers["state"], key),
            getattr(straight.policy.normalizers["state"], key),
        )


def test_a_signal_during_an_update_stops_after_that_iteration_and_resumes_exactly(tmp_path):
    straight = _runner(tmp_path / "a", "train.iterations=3", "train.eval_every=0")
    straight.learn()
    expected = read_metrics(straight.run_dir)[-1]

    interrupted = _runner(tmp_path / "b", "train.iterations=3", "train.eval_every=0", "train.save_every=100")
    optimizer_step = interrupted.algo.optimizer.step

    def step_then_sigterm_inside_the_second_update(*args, **kwargs):
        out = optimizer_step(*args, **kwargs)
        if interrupted.iteration == 1 and not hasattr(interrupted, "signalled"):  # the first step of it
            interrupted.signalled = True
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    interrupted.algo.optimizer.step = step_then_sigterm_inside_the_second_update
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        interrupted.learn()
    assert interrupted.signalled
    assert [r["iteration"] for r in read_metrics(interrupted.run_dir)] == [1, 2]  # the update went on
    assert signal.getsignal(signal.SIGTERM) is handler  # the runner's own handler is gone
    resumed = _runner(tmp_path / "b", resume_dir=interrupted.run_dir)
    assert resumed.iteration == 2
    resumed.learn()
    got = read_metrics(interrupted.run_dir)[-1]
    assert got["iteration"] == 3
    for key in ("train/policy_loss", "train/value_loss", "rollout/return", "train/approx_kl"):
        assert got[key] == expected[key], key


@pytest.mark.parametrize(
    "options", [[], ASYNC_SYNCHRONOUS, PIPELINED], ids=["plain", "async-s0", "pipelined"]
)
def test_a_crash_inside_an_update_keeps_the_last_checkpoint_and_resumes_exactly(tmp_path, options):
    """A crash (or a second signal) after some optimizer steps of iteration 3 once saved that half-updated
    state as iteration 2, and the resumed run diverged; metrics.jsonl kept no line twice either way."""
    straight = _runner(tmp_path / "a", "train.iterations=3", "train.save_every=1", *options)
    straight.learn()
    expected = read_metrics(straight.run_dir)

    interrupted = _runner(tmp_path / "b", "train.iterations=3", "train.save_every=1", *options)
    optimizer_step = interrupted.algo.optimizer.step

    def crash_after_a_step_of_the_third_update(*args, **kwargs):
        out = optimizer_step(*args, **kwargs)
        if interrupted.iteration == 2:
            raise RuntimeError("crash")
        return out

    interrupted.algo.optimizer.step = crash_after_a_step_of_the_third_update
    with pytest.raises(RuntimeError, match="crash"):
        interrupted.learn()
    resumed = _runner(tmp_path / "b", resume_dir=interrupted.run_dir)
    assert resumed.iteration == 2
    resumed.learn()
    got = read_metrics(interrupted.run_dir)
    assert [r["iteration"] for r in got] == [1, 2, 3]
    for key in ("train/policy_loss", "train/value_loss", "rollout/return", "train/approx_kl"):
        assert got[-1][key] == expected[-1][key], key


def test_resuming_a_run_stopped_before_its_first_save_starts_it_over(tmp_path, caplog):
    started = _runner(tmp_path, "train.iterations=1")  # its folder holds config.yaml only
    resumed = _runner(tmp_path, resume_dir=started.run_dir)
    assert resumed.iteration == 0
    assert "no checkpoint yet" in caplog.text


def test_keep_checkpoints_keeps_the_latest_numbered_copies(tmp_path):
    runner = _runner(tmp_path, "train.iterations=3", "train.save_every=1", "train.keep_checkpoints=2")
    runner.learn()
    kept = sorted(p.name for p in (runner.run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert kept == ["2", "3"]
    second = runner.run_dir / "checkpoints" / "2"
    assert restore_checkpoint(second, runner.policy, "cpu", {})["iteration"] == 2  # whole, checksums too


def test_cleanrl_details_keep_the_first_ratio_one_and_save_the_running_stats(tmp_path):
    runner = _runner(tmp_path, "train.iterations=3", "train.eval_every=0", "algo.actor_lr=3e-4", *CLEANRL)
    runner.learn()
    rows = read_metrics(runner.run_dir)
    # obs stats change only between iterations, so every update recomputes the rollout's log-probs exactly
    assert all(r["train/ratio0_maxdev"] < 1e-5 for r in rows)
    assert [r["train/actor_lr"] for r in rows] == pytest.approx([3e-4, 2e-4, 1e-4])  # linear to 0 at 3
    state = runner.policy.normalizers["state"]
    assert state.mean.abs().sum() > 0 and not torch.equal(state.std, torch.ones_like(state.std))
    saved = load_policy(runner.run_dir / LAST / "policy")  # eval, deploy and serve read these
    assert torch.equal(saved.normalizers["state"].mean, state.mean)
    assert torch.equal(saved.normalizers["state"].std, state.std)


def test_mismatched_action_dim_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="set policy.action_dim=1"):
        _runner(tmp_path, "policy.action_dim=7")


def test_experiment_settings_a_checkpoint_replaces_are_named_in_a_warning(tmp_path, caplog):
    first = _runner(tmp_path, "train.iterations=1", "train.eval_every=0", "train.videos=0")
    first.learn()
    source = first.run_dir / LAST / "policy"
    with caplog.at_level(logging.WARNING, logger="embodrl.train.policy_setup"):
        _runner(tmp_path, f"policy.init_from={source}")
        assert not caplog.records  # the experiment that wrote the checkpoint: nothing to report
        loaded = _runner(tmp_path, f"policy.init_from={source}", "policy.gaussian.hidden_dims=[16,16]")
    assert "gaussian.hidden_dims=(16, 16) (checkpoint: (32, 32))" in caplog.text
    assert loaded.policy.cfg.gaussian.hidden_dims == (32, 32)


def test_freezing_a_policy_built_from_scratch_is_named_in_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="embodrl.train.policy_setup"):
        _runner(tmp_path, "policy.lora.vision=frozen")  # the pendulum policy has no CNN: nothing kept
        assert not caplog.records
        _runner(tmp_path, "policy.lora.action_head=frozen")
    assert "its action_head weights stay at their random initialization" in caplog.text


@pytest.mark.slow
def test_ppo_gaussian_learns_to_balance(tmp_path):
    torch.manual_seed(0)
    runner = _runner(
        tmp_path,
        "train.iterations=25",
        "train.eval_every=0",
        "env.num_envs=8",
        "env.max_episode_steps=200",
        "algo.actor_lr=3e-4",
        "algo.target_kl=null",
        "algo.minibatch_size=400",
    )
    runner.learn()
    returns = [r["rollout/return"] for r in read_metrics(runner.run_dir) if "rollout/return" in r]
    assert sum(returns[-3:]) / 3 > 5 * sum(returns[:3]) / 3, returns


def test_vla_policy_trains_on_task_ids_through_its_instruction_table(tmp_path):
    """Rollout buffers stay all-tensor: the VLA reads its prompt by task_id from the env's table."""
    cfg = compose(
        "openvla_oft_grpo_nano",
        [
            f"run_root={tmp_path}",
            "env.num_envs=4",
            "env.max_episode_steps=8",
            "algo.group_size=2",
            "algo.grpo_success_range=null",
            "train.iterations=1",
            "train.eval_every=0",
            "train.eval_episodes=2",
            "train.tensorboard=false",
        ],
    )
    runner = OnPolicyRunner(cfg, make_run_dir(cfg))
    assert runner.policy.cfg.vla.instructions == tuple(runner.env.instruction_table)
    runner.learn()
    (row,) = read_metrics(runner.run_dir)
    assert row["train/ratio0_maxdev"] < 1e-4


@pytest.mark.slow
def test_state_mlp_ppo_solves_reach(tmp_path):
    cfg = compose(
        "reach_ppo",
        [f"run_root={tmp_path}", "train.iterations=40", "train.eval_every=0", "train.tensorboard=false"],
    )
    final = OnPolicyRunner(cfg, make_run_dir(cfg)).learn()
    assert final["eval/success"] >= 0.9, final


@pytest.mark.parametrize("rollout_steps", [0, 5])
def test_fixed_windows_carry_episodes_over_and_episode_rollouts_reset(tmp_path, rollout_steps):
    runner = _runner(tmp_path, f"train.rollout_steps={rollout_steps}", "env.max_episode_steps=1000")
    schedule = runner.schedule
    schedule.collect(runner._initial_states)
    after_first = schedule._next_obs["state"].clone()
    second = schedule.collect(runner._initial_states)
    continued = torch.equal(second.buffer.data["obs"]["state"][0], after_first)
    assert continued == (rollout_steps > 0)
    runner.schedule.close()
