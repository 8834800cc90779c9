"""Demos played live by the scripted expert (`embodrl pretrain`): the samples are the expert's action
chunks from initial states past the evaluation's, drawn as often as asked, and SFT on them learns."""

from __future__ import annotations

import json

import pytest
import torch

from embodrl.cli import main
from embodrl.config import compose
from embodrl.errors import UserError
from embodrl.sims.registry import make_env
from embodrl.train.simulated_demos import SimulatedDemos

REACH = ["env.task=reach", "env.num_envs=3", "env.max_episode_steps=30"]


def _stream(
    pool: int = 256,
    reuse: float = 2.0,
    first_state_id: int = 20000,
    states: int = 1000,
    perturb: float = 0.0,
    policy=None,
    policy_share: float = 0.0,
):
    env = make_env(compose(None, REACH).env)
    starts: list[int] = []
    reset_to = env.reset_to

    def recording_reset_to(state_ids, env_ids=None):
        starts.extend(torch.as_tensor(state_ids).tolist())
        return reset_to(state_ids, env_ids)

    env.reset_to = recording_reset_to
    stream = SimulatedDemos(
        env,
        ("state", "privileged"),
        3,
        pool,
        reuse,
        first_state_id,
        states,
        seed=0,
        perturb=perturb,
        policy=policy,
        policy_share=policy_share,
    )
    return stream, starts


def test_samples_are_the_experts_chunks_of_whole_successful_episodes_from_unused_states():
    stream, starts = _stream()
    stream.fill(100)
    assert stream.filled >= 100 and stream.episodes > 0 and 20000 <= min(starts) <= max(starts) < 21000
    action, pad = stream.pool["action"][: stream.filled], stream.pool["action_is_pad"][: stream.filled]
    ends = torch.nonzero(pad[:, 1]).flatten()  # the last frame of each episode pads the rest of its chunk
    assert pad[ends].tolist() == [[False, True, True]] * len(ends)
    assert torch.equal(action[ends, 1], action[ends, 0])  # padding repeats the last action
    inside = torch.tensor([i for i in range(1, stream.filled) if not pad[i - 1, 1]])
    assert torch.equal(action[inside - 1, 1], action[inside, 0])  # chunks of consecutive expert actions
    stats = stream.normalization_stats()
    assert set(stats) == {"action", "state", "privileged"} and stats["action"]["mean"].shape == (7,)


def test_each_sample_is_drawn_about_reuse_times_and_the_pool_keeps_the_latest():
    stream, _ = _stream(pool=64, reuse=2.0)
    stream.fill(64)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        batch = stream.batch(16, generator)
        assert batch["action"].shape == (16, 3, 7) and len(batch["instruction"]) == 16
    assert stream.samples_made * 2.0 >= stream.samples_drawn == 320
    assert stream.samples_made > 64 and stream.filled == 64  # the ring wrapped


def test_a_burst_pushes_the_executed_moves_and_drops_the_samples_whose_chunk_holds_it():
    stream, _ = _stream(perturb=0.2)
    executed, expert = [], []
    step, expert_actions = stream.env.step, stream.env.expert_actions
    stream.env.step = lambda actions: executed.append(actions[:, 0].clone()) or step(actions)
    stream.env.expert_actions = lambda: expert.append(expert_actions()) or expert[-1]
    stream.fill(100)
    assert stream.bursts > 0 and stream.episodes > 0  # the expert steers back and still succeeds
    push = torch.stack(executed) - torch.stack(expert)  # [steps, N, A]
    pushed = push.abs().amax(-1) > 0
    assert pushed.any() and not push[..., 3:].any()  # only the position moves are pushed
    assert stream.bursts <= int(pushed.sum()) <= 3 * stream.bursts  # a burst: perturb_steps=3 steps at most

    frames = [
        ({"state": torch.tensor([float(t)])}, torch.full((7,), float(t)), t in (4, 5, 6)) for t in range(10)
    ]
    stream.pool, stream.filled, stream.cursor, stream.samples_made = {}, 0, 0, 0
    stream._add(frames)
    assert stream.pool["state"][: stream.filled].flatten().tolist() == [0, 1, 7, 8, 9]
    assert stream.pool["action"][2, :, 0].tolist() == [7, 8, 9]  # after the burst: the expert's own steering
    assert stream.pool["action_is_pad"][4].tolist() == [False, True, True]


def test_episodes_the_policy_plays_are_labelled_with_the_experts_actions_failed_ones_too():
    calls: list[int] = []

    def still(obs):  # a policy that never moves the hand: every reach episode fails
        calls.append(obs.batch_size[0])
        return torch.zeros(obs.batch_size[0], 2, 7)

    stream, _ = _stream(policy=still, policy_share=1.0)
    executed, expert = [], []
    step, expert_actions = stream.env.step, stream.env.expert_actions
    stream.env.step = lambda actions: executed.append(actions[:, 0].clone()) or step(actions)
    stream.env.expert_actions = lambda: expert.append(expert_actions()) or expert[-1]
    stream.fill(60)
    assert stream.policy_episodes >= 3 and stream.policy_success == 0.0 and stream.episodes == 0
    assert not torch.stack(executed).any()  # the policy acted, not the expert
    labels = stream.pool["action"][: stream.filled, 0]
    assert labels[:, :3].abs().sum(-1).min() > 0  # the expert's moves toward the target, where the hand stood
    assert torch.equal(labels[:30], torch.stack(expert)[:30, 0])  # env 0's first episode, step by step
    assert sum(calls) == len(executed) * 3 / 2  # one call per two-action chunk per env, only for those spent


def test_a_state_range_past_the_env_is_refused():
    with pytest.raises(UserError, match="stream_first_state_id"):
        _stream(first_state_id=99_500)


@pytest.mark.slow
def test_pretrain_on_the_expert_played_live_learns_reach(tmp_path, capsys):
    main(
        [
            "pretrain",
            "reach_ppo",
            "env.num_envs=8",
            "policy.family=flow",
            "sft.steps=400",
            "sft.batch_size=128",
            "sft.eval_every=0",
            "sft.eval_episodes=20",
            "sft.videos=0",
            "sft.stream_pool=4096",
            "train.tensorboard=false",
            f"run_root={tmp_path}",
        ]
    )
    (run_dir,) = (tmp_path / "reach_ppo").iterdir()
    assert "source: expert" in (run_dir / "config.yaml").read_text()
    summary = json.loads((run_dir / "final_eval.json").read_text())
    assert summary["success_rate"] >= 0.7 and summary["samples"] > 400 * 128 / 2 * 0.9


def test_pretrain_plays_the_policy_it_trains_under_dagger(tmp_path):
    main(
        [
            "pretrain",
            "reach_ppo",
            "env.num_envs=4",
            "env.max_episode_steps=20",
            "policy.family=flow",
            "sft.steps=20",
            "sft.batch_size=32",
            "sft.eval_every=0",
            "sft.eval_episodes=2",
            "sft.videos=0",
            "sft.stream_pool=512",
            "sft.stream_policy_share=1.0",
            "train.tensorboard=false",
            f"run_root={tmp_path}",
        ]
    )
    (run_dir,) = (tmp_path / "reach_ppo").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "sft/policy_episodes" in r][-1]
    assert last["sft/policy_episodes"] > 0 and last["sft/expert_episodes"] == 0  # the policy played them all
    assert 0.0 <= last["sft/policy_success"] <= 1.0
