"""checkpoints/best: kept at the best evaluation, carried over a resume, played again on held-out states."""

from __future__ import annotations

import copy
import json

import torch

from embodrl.config import compose, make_run_dir
from embodrl.policies.loading import load_policy
from embodrl.sims.registry import make_env
from embodrl.train import sft_runner
from embodrl.train.best import BEST, BEST_EVAL_FILE, BestCheckpoint
from embodrl.train.collect import CollectConfig, collect_demos
from embodrl.train.rl_runner import OnPolicyRunner
from embodrl.train.sft_runner import SFTRunner
from tests.engine.helpers import make_policy
from tests.pendulum import pendulum

RUN = ["train.iterations=4", "train.eval_every=2", "train.eval_episodes=3", "train.videos=0"]


def _weights(policy) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in policy.state_dict().items()}


def test_the_best_is_replaced_only_by_a_higher_success_then_return_and_is_read_back(tmp_path):
    cfg = pendulum()
    env = make_env(cfg.env)
    policy = make_policy(cfg, env)
    env.close()
    best = BestCheckpoint(tmp_path)
    assert best.iteration is None
    assert best.consider(2, {"eval/success": 0.5, "eval/return": 10.0}, policy)
    saved = _weights(policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    assert not best.consider(4, {"eval/success": 0.4, "eval/return": 99.0}, policy)  # less success
    assert not best.consider(6, {"eval/success": 0.5, "eval/return": 10.0}, policy)  # a tie keeps the first
    resumed = BestCheckpoint(tmp_path)  # what a resumed run starts from
    assert resumed.iteration == 2
    loaded = load_policy(tmp_path / BEST / "policy")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in saved.items())
    more_return = {"eval/success": 0.5, "eval/return": 11.0}  # the same success
    assert resumed.consider(8, more_return, policy)
    assert BestCheckpoint(tmp_path).iteration == 8


def test_an_earlier_best_is_kept_and_evaluated_on_held_out_states(tmp_path):
    cfg = pendulum(*RUN, f"run_root={tmp_path}")
    runner = OnPolicyRunner(cfg, make_run_dir(cfg))
    # The periodic evaluations score 0.9 at iteration 2 and 0.1 at 4: the best is iteration 2's policy
    scores, snapshots, played_from = iter([0.9, 0.1, 0.1]), {}, []
    real_play = runner.play_from

    def scripted_evaluate(record=0, video_dir=None):
        snapshots.setdefault(runner.iteration, copy.deepcopy(_weights(runner.policy)))
        return {"eval/success": next(scores), "eval/return": 0.0, "eval/length": 1.0}

    def recording_play(policy, first_state_id=0, record=0, video_dir=None):
        played_from.append(first_state_id)
        return real_play(policy, first_state_id, record, video_dir)

    runner.evaluate, runner.play_from = scripted_evaluate, recording_play
    final = runner.learn()

    assert final["best/iteration"] == 2.0
    best = load_policy(runner.run_dir / BEST / "policy")
    assert all(torch.equal(best.state_dict()[k], v) for k, v in snapshots[2].items())
    assert not all(torch.equal(best.state_dict()[k], v) for k, v in snapshots[4].items())
    assert played_from == [3, 3]  # best and last, on the 3 states after the 3 evaluation states
    report = json.loads((runner.run_dir / BEST_EVAL_FILE).read_text())
    assert report["iteration"] == 2 and report["chosen_on"]["success_rate"] == 0.9
    held_out = report["held_out"]
    assert (
        held_out["first_state_id"] == 3 and held_out["best"]["episodes"] == held_out["last"]["episodes"] == 3
    )
    assert final["best/held_out_success"] == held_out["best"]["success_rate"]
    assert final["best/last_held_out_success"] == held_out["last"]["success_rate"]


def test_a_last_policy_that_is_best_needs_no_held_out_run_and_keep_best_false_keeps_none(tmp_path):
    cfg = pendulum(*RUN, f"run_root={tmp_path / 'kept'}")
    runner = OnPolicyRunner(cfg, make_run_dir(cfg))
    scores = iter([0.1, 0.9, 0.9])
    runner.evaluate = lambda record=0, video_dir=None: {"eval/success": next(scores), "eval/return": 0.0}
    final = runner.learn()
    assert final["best/iteration"] == 4.0 and "best/held_out_success" not in final
    assert (runner.run_dir / BEST / "policy").is_dir() and not (runner.run_dir / BEST_EVAL_FILE).exists()

    cfg = pendulum(*RUN, "train.keep_best=false", f"run_root={tmp_path / 'none'}")
    runner = OnPolicyRunner(cfg, make_run_dir(cfg))
    final = runner.learn()
    assert "best/iteration" not in final and not (runner.run_dir / BEST).exists()


def test_sft_keeps_its_best_step_and_evaluates_it_on_held_out_states(tmp_path, monkeypatch):
    data = tmp_path / "demos"
    cfg = compose(
        None,
        [
            "policy=flow_state",
            "env.task=reach",
            "env.num_envs=3",
            "env.max_episode_steps=20",
            f"sft.dataset={data}",
            "sft.steps=6",
            "sft.batch_size=16",
            "sft.eval_every=2",
            "sft.eval_episodes=3",
            "sft.videos=0",
            "train.tensorboard=false",
            f"run_root={tmp_path}",
        ],
    )
    collect_demos(cfg.env, data, CollectConfig(episodes_per_task=1), progress=False)
    scores = iter([0.1, 0.9, 0.1, 0.1])  # steps 2, 4, 6 and the final evaluation: step 4 is the best
    monkeypatch.setattr(
        sft_runner, "eval_metrics", lambda results: {"eval/success": next(scores), "eval/return": 0}
    )
    first_states = []
    real_evaluate = sft_runner.evaluate_policy

    def recording_evaluate(*args, first_state_id=0, **kwargs):
        first_states.append(first_state_id)
        return real_evaluate(*args, first_state_id=first_state_id, **kwargs)

    monkeypatch.setattr(sft_runner, "evaluate_policy", recording_evaluate)
    runner = SFTRunner(cfg, make_run_dir(cfg))
    summary = runner.learn()
    assert summary["best/iteration"] == 4.0 and summary["best/success"] == 0.9
    assert first_states == [0, 0, 0, 0, 3, 3]  # 3 periodic, the final, then best and last on states 3..5
    report = json.loads((runner.run_dir / BEST_EVAL_FILE).read_text())
    assert report["held_out"]["best"]["episodes"] == 3 and report["last_iteration"] == 6
    assert summary["best/held_out_success"] == report["held_out"]["best"]["success_rate"]
