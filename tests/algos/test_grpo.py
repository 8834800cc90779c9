import statistics

import pytest
import torch

from embodrl.algos.config import AlgoConfig
from embodrl.algos.grpo import compute_grpo, grpo_advantages
from embodrl.errors import ConfigError
from tests.algos.rollouts import random_rollout


def reference_grpo(rollout, group_size, success_range, eps):
    """Slow: list each env's finished episodes, then score the k-th episodes of complete groups."""
    reward = rollout["reward"].sum(-1).tolist()
    done = (rollout["terminated"] | rollout["truncated"]).tolist()
    success = rollout["success"].tolist()
    num_steps, num_envs = len(reward), len(reward[0])
    episodes = []  # per env: list of (steps, return, success)
    for n in range(num_envs):
        finished, steps = [], []
        for t in range(num_steps):
            steps.append(t)
            if done[t][n]:
                finished.append((steps, sum(reward[u][n] for u in steps), any(success[u][n] for u in steps)))
                steps = []
        episodes.append(finished)
    adv = torch.zeros(num_steps, num_envs)
    mask = torch.zeros(num_steps, num_envs, dtype=torch.bool)
    for g in range(num_envs // group_size):
        members = range(g * group_size, (g + 1) * group_size)
        for k in range(num_steps):
            if any(len(episodes[n]) <= k for n in members):
                break
            returns = [episodes[n][k][1] for n in members]
            rate = sum(episodes[n][k][2] for n in members) / group_size
            if success_range is not None and not success_range[0] <= rate <= success_range[1]:
                continue
            mean, std = statistics.mean(returns), statistics.stdev(returns)
            for n in members:
                for t in episodes[n][k][0]:
                    adv[t, n] = (episodes[n][k][1] - mean) / (std + eps)
                    mask[t, n] = True
    return adv, mask


@pytest.mark.parametrize("success_range", [None, (0.1, 0.9), (0.5, 1.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_matches_slow_reference_with_several_episodes_per_env(seed, success_range):
    rollout, _ = random_rollout(num_steps=20, num_envs=12, chunk=3, seed=seed, p_term=0.2, p_trunc=0.05)
    adv, _, mask = compute_grpo(
        rollout["reward"],
        rollout["terminated"],
        rollout["truncated"],
        rollout["success"],
        3,
        success_range,
        1e-6,
    )
    expected_adv, expected_mask = reference_grpo(rollout, 3, success_range, 1e-6)
    assert mask.any() and (~mask).any()
    assert torch.equal(mask, expected_mask)
    torch.testing.assert_close(adv, expected_adv, rtol=1e-5, atol=1e-5)


def _hand_rollout():
    """Two groups of 2 envs, T = 4; rewards 1 on success at the episode's last step."""
    reward = torch.zeros(4, 4)
    term = torch.zeros(4, 4, dtype=torch.bool)
    trunc = torch.zeros(4, 4, dtype=torch.bool)
    term[1, 0], reward[1, 0] = True, 1.0  # env 0: success at step 1, then an unfinished tail
    trunc[3, 1] = True  # env 1: times out at step 3
    trunc[2, 2] = True  # env 2: times out at step 2, then an unfinished tail
    term[1, 3], reward[1, 3] = True, 1.0  # env 3: success at step 1,
    term[2, 3] = True  # then fails at step 2, then an unfinished tail
    return reward, term, trunc, reward > 0


def test_grpo_hand_case_broadcasts_group_normalized_returns():
    reward, term, trunc, success = _hand_rollout()
    adv, returns, mask = compute_grpo(reward, term, trunc, success, 2, None, 0.0)
    # Returns (1, 0) in a group: mean 0.5, unbiased std sqrt(0.5), so A = +-0.5 / sqrt(0.5).
    a = 0.5**0.5
    # Group 0: env 0 (return 1, steps 0-1) vs env 1 (return 0, steps 0-3).
    assert torch.allclose(adv[:2, 0], torch.tensor([a, a]))
    assert torch.allclose(adv[:, 1], torch.full((4,), -a))
    # Env 0's tail after its episode (steps 2-3) is unfinished: masked, advantage 0.
    assert mask[:2, 0].all() and not mask[2:, 0].any() and (adv[2:, 0] == 0).all()
    # Group 1, first episodes: env 2 (return 0, steps 0-2) vs env 3 (return 1, steps 0-1).
    assert torch.allclose(adv[:3, 2], torch.full((3,), -a)) and torch.allclose(
        adv[:2, 3], torch.full((2,), a)
    )
    # Env 3's second episode (step 2) has no partner: env 2 did not finish a second one.
    assert not mask[2:, 3].any() and not mask[3, 2]
    assert returns[0, 0] == 1.0 and returns[3, 1] == 0.0


def test_grpo_filter_drops_all_success_and_all_fail_groups():
    reward = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]])
    term = torch.ones(1, 6, dtype=torch.bool)
    trunc = torch.zeros(1, 6, dtype=torch.bool)
    adv, _, mask = compute_grpo(reward, term, trunc, reward > 0, 2, (0.1, 0.9), 1e-6)
    assert mask.tolist() == [[False, False, False, False, True, True]]
    _, _, unfiltered = compute_grpo(reward, term, trunc, reward > 0, 2, None, 1e-6)
    assert unfiltered.all()
    assert adv[0, 4] > 0 > adv[0, 5]


def test_grpo_needs_whole_groups_and_ignores_the_critic():
    rollout, _ = random_rollout(5, 6, 2, seed=0)
    with pytest.raises(ConfigError, match="algo.group_size"):
        grpo_advantages(rollout, None, AlgoConfig(name="grpo", group_size=4))
    out = grpo_advantages(rollout, None, AlgoConfig(name="grpo", group_size=3))
    rollout["value"] += 100.0
    again = grpo_advantages(rollout, None, AlgoConfig(name="grpo", group_size=3))
    assert torch.equal(out.advantages, again.advantages)
