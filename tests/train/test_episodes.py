"""run_episodes: the fixed id schedule, and a caller's own schedule with end-of-episode reports."""

from __future__ import annotations

import torch

from embodrl.train.episodes import fixed_schedule, run_episodes
from tests.data.counting_env import INSTRUCTIONS, CountingEnv


def zero_actions(env: CountingEnv):
    return lambda obs: torch.zeros(env.num_envs, 1, 3)


def test_fixed_schedule_gives_the_same_results_for_any_number_of_envs():
    # state id s lasts 3 + s % 4 steps and fails when s % 5 == 4
    for num_envs in (1, 3, 4):
        env = CountingEnv(num_envs=num_envs, image=False)
        results = run_episodes(env, zero_actions(env), 7, first_state_id=2)
        assert results.success == [True, True, False, True, True, True, True]
        assert results.length == [3 + s % 4 for s in range(2, 9)]
        assert results.instruction == [INSTRUCTIONS[s % 2] for s in range(2, 9)]
    schedule = fixed_schedule(num_envs=2, num_episodes=5)
    handed_out = [schedule(0), schedule(1), schedule(0), schedule(0), schedule(0), schedule(1)]
    assert handed_out == [0, 1, 2, 4, -1, 3]


def test_custom_schedule_reports_every_episode_and_leaves_finished_envs_idle():
    env = CountingEnv(num_envs=3, image=False)
    remaining = [4, 3, 2]  # the episode ids still to hand out, last first
    ended: list[tuple[int, int, bool]] = []

    def next_episode(env_id: int) -> int:
        if env_id == 2:  # env 2 never plays
            return -1
        return remaining.pop() if remaining else -1

    def report(env_id: int, episode: int, ok: bool) -> None:
        ended.append((env_id, episode, ok))

    results = run_episodes(env, zero_actions(env), 5, 0, 10, next_episode=next_episode, on_episode_end=report)
    assert sorted(e for _, e, _ in ended) == [2, 3, 4]
    assert {e: ok for _, e, ok in ended} == {2: True, 3: True, 4: False}  # state 14 fails
    assert results.success == [True, True, False]  # in episode-id order
    assert set(env.executed) == {10, 12, 13, 14, 999}  # env 2 only sat on state 10
    assert env.state_id.tolist() == [999] * 3  # finished envs left idle were not reset again
