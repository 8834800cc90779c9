"""Demo collection: expert labels, DART noise, dropped failures, the dataset written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embodrl.data.lerobot_dataset import LeRobotDataset, LeRobotDatasetWriter
from embodrl.errors import UserError
from embodrl.sims.config import EnvConfig
from embodrl.train.collect import (
    CollectConfig,
    collect_demos,
    collect_episodes,
    dataset_features,
    tasks_to_collect,
)
from tests.data.counting_env import INSTRUCTIONS, CountingEnv
from tests.train.holding_env import HoldingEnv, success_step


def _collect(tmp_path, cfg: CollectConfig, num_episodes: int, env: CountingEnv) -> LeRobotDataset:
    with LeRobotDatasetWriter(tmp_path / "demos", cfg.fps, dataset_features(env)) as writer:
        kept, failed = collect_episodes(env, writer, num_episodes, cfg)
    assert kept == num_episodes
    return LeRobotDataset(tmp_path / "demos")


def test_collects_successes_with_clean_labels_and_drops_failures(tmp_path):
    env = CountingEnv(num_envs=3)
    cfg = CollectConfig(noise_std=0.5, first_state_id=10, seed=1)
    with LeRobotDatasetWriter(tmp_path / "demos", cfg.fps, dataset_features(env)) as writer:
        kept, failed = collect_episodes(env, writer, 8, cfg)
    # state ids from 10: 14 fails (s % 5 == 4), so the first 9 attempts give the 8 successes
    assert (kept, failed) == (8, 1)
    ds = LeRobotDataset(tmp_path / "demos")
    assert ds.num_episodes == 8
    assert set(ds.features) >= {"observation.state", "observation.images.main", "action"}
    starts = [int(ds.episode(e)["observation.state"][0, 0]) for e in range(8)]
    assert sorted(starts) == [10, 11, 12, 13, 15, 16, 17, 18]
    # each episode records the initial state it started from (the counting env's state starts at its id)
    assert ds.episodes["init_state_id"] == starts and ds.episodes["env_task"] == [""] * 8
    for e in range(8):
        ep = ds.episode(e)
        state_id = int(ep["observation.state"][0, 0])
        length = 3 + state_id % 4
        assert len(ep["action"]) == length
        assert ep["task"] == INSTRUCTIONS[state_id % 2]
        np.testing.assert_array_equal(ep["observation.state"][:, 1], np.arange(length))
        clean = np.stack([np.full(length, state_id / 1000), np.arange(length) / 10, np.zeros(length)], -1)
        np.testing.assert_allclose(ep["action"], clean, atol=1e-6)  # labels are the clean expert actions
        executed = np.stack(env.executed[state_id])
        noisy = (state_id - cfg.first_state_id) % 2 == 1  # DART: odd-numbered attempts
        assert (np.abs(executed - clean).max() > 0.05) == noisy
        assert (
            np.abs(ep["observation.images.main"][:, 0, 0, 0].astype(int) - np.arange(length) * 20).max() <= 6
        )


def test_result_does_not_depend_on_the_number_of_envs(tmp_path):
    cfg = CollectConfig(first_state_id=0, noise_std=0.3)
    env_one, env_four = CountingEnv(num_envs=1, image=False), CountingEnv(num_envs=4, image=False)
    one = _collect(tmp_path / "one", cfg, 5, env_one)
    four = _collect(tmp_path / "four", cfg, 5, env_four)
    np.testing.assert_array_equal(np.stack(env_one.executed[3]), np.stack(env_four.executed[3]))  # same noise

    def starts(ds: LeRobotDataset) -> list[int]:
        return sorted(int(ds.episode(e)["observation.state"][0, 0]) for e in range(ds.num_episodes))

    assert starts(one) == starts(four) == [0, 1, 2, 3, 5]


def test_more_envs_than_wanted_episodes_start_only_the_needed_attempts(tmp_path):
    env = CountingEnv(num_envs=5, image=False)
    ds = _collect(tmp_path, CollectConfig(first_state_id=2), 2, env)
    assert sorted(int(ds.episode(e)["observation.state"][0, 0]) for e in range(2)) == [2, 3]
    assert set(env.executed) == {2, 3, 999}  # envs 2-4 sat on state 2, no attempt from state 4 on


def test_bad_settings_raise_user_errors(tmp_path):
    env = CountingEnv()
    writer = LeRobotDatasetWriter(tmp_path / "demos", 20, dataset_features(env))
    with pytest.raises(UserError, match="initial states"):
        collect_episodes(env, writer, 600, CollectConfig(first_state_id=0))
    with pytest.raises(UserError, match="episodes_per_task"):
        CollectConfig(episodes_per_task=0)


def test_collects_every_tabletop_task_into_one_dataset(tmp_path):
    env_cfg = EnvConfig(suite="tabletop-basic", num_envs=2, num_threads=1)
    stats = collect_demos(env_cfg, tmp_path / "demos", CollectConfig(episodes_per_task=2), progress=False)
    ds = LeRobotDataset(tmp_path / "demos")
    assert stats.episodes == ds.num_episodes == 2 * len(stats.per_task) == 12
    assert stats.frames == ds.num_frames
    assert ds.features["action"]["shape"] == [7]
    assert {"observation.state", "observation.environment_state"} <= set(ds.features)
    assert len(ds.tasks) >= 6
    assert sorted(set(ds.episodes["env_task"])) == sorted(stats.per_task)  # the env each id indexes


def test_tasks_picks_a_subset_of_the_suite_and_names_bad_choices():
    """`collect --tasks`: pretraining data that leaves the target task out."""
    suite = EnvConfig(suite="tabletop-basic")
    assert tasks_to_collect(suite, ("push", "stack")) == ("push", "stack")
    assert "pick" in tasks_to_collect(suite)
    assert tasks_to_collect(EnvConfig(suite="tabletop-basic", task="pick")) == ("pick",)
    with pytest.raises(UserError, match=r"unknown task\(s\) lift for suite tabletop-basic; valid: reach"):
        tasks_to_collect(suite, ("push", "lift"))
    with pytest.raises(UserError, match="drop env.task=pick"):
        tasks_to_collect(EnvConfig(suite="tabletop-basic", task="pick"), ("push",))


def test_resume_continues_an_interrupted_collection(tmp_path, monkeypatch):
    env_cfg = EnvConfig(suite="tabletop-basic", num_envs=2, num_threads=1)
    cfg = CollectConfig(episodes_per_task=3, tasks=("reach", "push"))
    real_add = LeRobotDatasetWriter.add_episode
    saved = []

    def killed_after_four(self, *args, **kwargs):
        if len(saved) == 4:
            raise KeyboardInterrupt  # kill: the fifth episode is never written
        saved.append(1)
        return real_add(self, *args, **kwargs)

    monkeypatch.setattr(LeRobotDatasetWriter, "add_episode", killed_after_four)
    with pytest.raises(KeyboardInterrupt):
        collect_demos(env_cfg, tmp_path / "demos", cfg, progress=False)
    monkeypatch.setattr(LeRobotDatasetWriter, "add_episode", real_add)
    with pytest.raises(UserError, match="not empty"):
        collect_demos(env_cfg, tmp_path / "demos", cfg, progress=False)
    stats = collect_demos(env_cfg, tmp_path / "demos", cfg, progress=False, resume=True)
    assert stats.per_task == {"reach": (0, 0), "push": (2, 0)}
    ds = LeRobotDataset(tmp_path / "demos")
    assert ds.num_episodes == 6
    pushes = [
        s for s, t in zip(ds.episodes["init_state_id"], ds.episodes["env_task"], strict=True) if t == "push"
    ]
    assert len(set(pushes)) == 3  # the resumed attempts start after the last kept one
    # killed after it was finalized: a resume finds it complete, or names what is missing
    assert collect_demos(env_cfg, tmp_path / "demos", cfg, progress=False, resume=True).episodes == 0
    more = CollectConfig(episodes_per_task=4, tasks=("reach", "push"))
    with pytest.raises(UserError, match="finished dataset with fewer episodes than asked"):
        collect_demos(env_cfg, tmp_path / "demos", more, progress=False, resume=True)


def test_labels_past_the_success_and_kept_failures_read_back(tmp_path):
    env = HoldingEnv(num_envs=2)
    cfg = CollectConfig(first_state_id=0, post_success_steps=2, keep_failures=True)
    with LeRobotDatasetWriter(tmp_path / "demos", cfg.fps, dataset_features(env)) as writer:
        kept, failed = collect_episodes(env, writer, 4, cfg, max_steps=8)
    # state ids 0, 1, 2 succeed, 3 fails (kept), 4 succeeds
    assert (kept, failed) == (4, 1)
    ds = LeRobotDataset(tmp_path / "demos")
    assert ds.features["next.reward"]["dtype"] == "float32" and ds.features["next.done"]["dtype"] == "bool"
    by_state = {s: e for e, s in enumerate(ds.episodes["init_state_id"])}
    assert sorted(by_state) == [0, 1, 2, 3, 4]
    for state_id, e in by_state.items():
        ep = ds.episode(e)
        first = success_step(state_id)
        assert ds.episodes["success"][e] == (first is not None)
        # frames show steps 0.. ; the labels say which show the task done (the bright image)
        expected = [first is not None and t >= first for t in range(len(ep["next.reward"]))]
        np.testing.assert_array_equal(ep["next.reward"] == 1.0, expected)
        np.testing.assert_array_equal(
            ep["next.reward"] == 1.0, ep["observation.images.main"][:, 0, 0, 0] > 100
        )
        assert len(ep["next.reward"]) == (8 if first is None else first + 2)  # K frames show success
        assert ep["next.done"].tolist() == [False] * (len(ep["next.done"]) - 1) + [True]


def test_a_policy_s_chunks_are_recorded_step_by_step_with_every_outcome(tmp_path, monkeypatch):

    def chunks(obs):  # a chunk of 2 per env: (state id, step when asked, index in chunk)
        state = obs["state"]
        return torch.stack(
            [
                torch.stack([state[:, 0] / 1000, state[:, 1] / 10, torch.full_like(state[:, 0], k)], -1)
                for k in (0, 1)
            ],
            1,
        )

    monkeypatch.setattr("embodrl.train.collect.action_source", lambda name, env, seed, device: chunks)
    env = CountingEnv(num_envs=2)
    cfg = CollectConfig(first_state_id=2, policy=str(tmp_path))
    with LeRobotDatasetWriter(tmp_path / "rollouts", cfg.fps, dataset_features(env)) as writer:
        successes, failures = collect_episodes(env, writer, 4, cfg)
    # state ids 2..5: 4 fails (4 % 5 == 4) and is kept; no fifth attempt replaces it
    assert (successes, failures) == (3, 1)
    ds = LeRobotDataset(tmp_path / "rollouts")
    by_state = {s: e for e, s in enumerate(ds.episodes["init_state_id"])}
    assert sorted(by_state) == [2, 3, 4, 5]
    assert ds.episodes["success"][by_state[4]] is False
    for state_id, e in by_state.items():
        ep = ds.episode(e)
        length = 3 + state_id % 4
        # the chunk's second action runs on the next frame: each pair of frames is one chunk
        expected_index = np.arange(length) % 2
        np.testing.assert_array_equal(ep["action"][:, 2], expected_index)
        asked_at = np.arange(length) - expected_index
        np.testing.assert_allclose(ep["action"][:, 1], asked_at / 10, atol=1e-6)
        np.testing.assert_allclose(np.stack(env.executed[state_id]), ep["action"], atol=1e-6)


def test_a_policy_takes_no_dart_noise_and_must_exist(tmp_path):
    with pytest.raises(UserError, match="--noise"):
        CollectConfig(policy=str(tmp_path), noise_std=0.1)
    with pytest.raises(UserError, match="no such checkpoint"):
        CollectConfig(policy=str(tmp_path / "missing"))
