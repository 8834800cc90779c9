"""HoldAfterSuccess: episodes end K steps past their first success, each observation with its label."""

from __future__ import annotations

import torch

from embodrl.train.hold_after_success import HoldAfterSuccess
from tests.train.holding_env import HoldingEnv


def _run(env: HoldAfterSuccess, steps: int) -> list[tuple[bool, bool, bool, bool]]:
    """(label of the observation acted on, terminated, truncated, success) of env 0 per step."""
    out = []
    for _ in range(steps):
        label = bool(env.success_now[0])
        res = env.step(torch.zeros(env.num_envs, 1, 2))
        out.append((label, bool(res.terminated[0]), bool(res.truncated[0]), bool(res.success[0])))
    return out


def test_episode_ends_k_steps_after_the_first_success_with_labels():
    env = HoldAfterSuccess(HoldingEnv(num_envs=1), hold_steps=2, max_steps=10)
    env.reset_to(torch.tensor([0]))  # success from step 3 on
    rows = _run(env, 5)
    assert [r[0] for r in rows] == [False, False, False, True, True]  # states at steps 0..4
    assert [r[1] for r in rows] == [False, False, False, False, True]  # 2 steps after step 3
    assert rows[-1][3] and not any(r[2] for r in rows)
    env.reset_to(torch.tensor([0]))
    assert not env.success_now[0]  # a reset clears the label


def test_failed_episode_is_truncated_at_max_steps():
    env = HoldAfterSuccess(HoldingEnv(num_envs=1), hold_steps=2, max_steps=6)
    env.reset_to(torch.tensor([3]))  # never succeeds
    rows = _run(env, 6)
    assert [r[2] for r in rows] == [False] * 5 + [True] and not any(r[0] or r[1] or r[3] for r in rows)


def test_zero_hold_ends_at_the_success():
    env = HoldAfterSuccess(HoldingEnv(num_envs=1), hold_steps=0)
    env.reset_to(torch.tensor([1]))  # success from step 4 on
    rows = _run(env, 4)
    assert [r[1] for r in rows] == [False, False, False, True] and not any(r[0] for r in rows)
