import math

import pytest
import torch

from embodrl.algos.config import AlgoConfig
from embodrl.algos.gae import compute_gae, gae_advantages
from tests.algos.rollouts import random_rollout


def reference_gae(rollout, last_value, gamma, lam, reward_type):
    """Slow: A_t as the explicit forward sum of discounted deltas up to the episode end or window end."""
    num_steps, num_envs, chunk = rollout["reward"].shape
    r = rollout["reward"].tolist()
    v = rollout["value"].tolist()
    term = rollout["terminated"].tolist()
    trunc = rollout["truncated"].tolist()
    boot = rollout["bootstrap_value"].tolist()
    steps = rollout["steps_executed"].tolist()
    adv = [[0.0] * num_envs for _ in range(num_steps)]
    for n in range(num_envs):
        deltas, discounts = [], []
        for t in range(num_steps):
            if reward_type == "chunk":
                reward, discount = sum(r[t][n]), gamma
            else:
                reward = sum(gamma**j * r[t][n][j] for j in range(steps[t][n]))
                discount = gamma ** steps[t][n]
            if term[t][n]:
                next_value = 0.0
            elif trunc[t][n]:
                next_value = boot[t][n]
            else:
                next_value = v[t + 1][n] if t + 1 < num_steps else last_value[n].item()
            deltas.append(reward + discount * next_value - v[t][n])
            discounts.append(discount)
        for t in range(num_steps):
            total, weight = 0.0, 1.0
            for u in range(t, num_steps):
                total += weight * deltas[u]
                if term[u][n] or trunc[u][n]:
                    break
                weight *= discounts[u] * lam
            adv[t][n] = total
    return torch.tensor(adv)


@pytest.mark.parametrize("reward_type", ["chunk", "action"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_slow_reference_with_resets(reward_type, seed):
    rollout, last_value = random_rollout(num_steps=17, num_envs=6, chunk=4, seed=seed)
    assert rollout["terminated"].any() and rollout["truncated"].any()
    cfg = AlgoConfig(gamma=0.97, gae_lambda=0.9, reward_type=reward_type)
    out = gae_advantages(rollout, last_value, cfg)
    expected = reference_gae(rollout, last_value, 0.97, 0.9, reward_type)
    torch.testing.assert_close(out.advantages, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.returns, expected + rollout["value"])
    assert out.mask.all()


def _single_env(
    rewards, values, last_value, terminated=(), truncated=(), bootstrap=None, steps=None, chunk=1
):
    """Tensors for one env: rewards [T, C] listed per decision."""
    num_steps = len(values)
    term = torch.zeros(num_steps, 1, dtype=torch.bool)
    trunc = torch.zeros(num_steps, 1, dtype=torch.bool)
    term[list(terminated), 0] = True
    trunc[list(truncated), 0] = True
    return dict(
        rewards=torch.tensor(rewards, dtype=torch.float32).view(num_steps, 1, chunk),
        values=torch.tensor(values).view(num_steps, 1),
        last_value=torch.tensor([last_value]),
        terminated=term,
        truncated=trunc,
        bootstrap_value=torch.tensor(bootstrap or [0.0] * num_steps).view(num_steps, 1),
        steps_executed=torch.tensor(steps or [chunk] * num_steps).view(num_steps, 1),
    )


def test_termination_does_not_bootstrap_and_truncation_bootstraps_final_obs():
    # Episode 1 = decisions 0-1 (terminated at 1), episode 2 = decisions 2-3 (truncated at 3), then 4.
    kwargs = _single_env(
        rewards=[[0.0], [1.0], [0.0], [0.5], [0.0]],
        values=[0.2, 0.4, 0.6, 0.8, 3.0],
        last_value=7.0,
        terminated=[1],
        truncated=[3],
        bootstrap=[0.0, 9.0, 0.0, 2.0, 0.0],  # 9.0 must be ignored: step 1 terminated
    )
    adv, ret = compute_gae(**kwargs, gamma=0.5, gae_lambda=1.0, reward_type="chunk")
    # lambda = 1: returns are discounted Monte Carlo returns bootstrapped only where allowed.
    expected_returns = [0.0 + 0.5 * 1.0, 1.0, 0.0 + 0.5 * (0.5 + 0.5 * 2.0), 0.5 + 0.5 * 2.0, 0.0 + 0.5 * 7.0]
    torch.testing.assert_close(ret[:, 0], torch.tensor(expected_returns))
    # The values of later episodes' states (0.6, 3.0) never leak into the earlier episodes.
    before, _ = compute_gae(**kwargs, gamma=0.5, gae_lambda=0.8, reward_type="chunk")
    kwargs["values"][2, 0] = 100.0
    kwargs["values"][4, 0] = -100.0
    after, _ = compute_gae(**kwargs, gamma=0.5, gae_lambda=0.8, reward_type="chunk")
    torch.testing.assert_close(after[:2], before[:2])
    assert after[3, 0] == before[3, 0]


def test_values_across_auto_reset_do_not_change_the_finished_episode():
    base = _single_env([[1.0], [1.0], [1.0]], [0.1, 0.2, 0.3], 0.4, truncated=[0], bootstrap=[5.0, 0.0, 0.0])
    adv_a, _ = compute_gae(**base, gamma=0.9, gae_lambda=0.95, reward_type="chunk")
    base["values"][1:] += 10.0
    base["last_value"] += 10.0
    adv_b, _ = compute_gae(**base, gamma=0.9, gae_lambda=0.95, reward_type="chunk")
    assert adv_a[0, 0] == pytest.approx(1.0 + 0.9 * 5.0 - 0.1)
    assert adv_b[0, 0] == adv_a[0, 0]


def test_action_rewards_discount_every_executed_env_step():
    # Two decisions of chunk 3; the second episode ends after 2 executed actions (terminated).
    kwargs = _single_env(
        rewards=[[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]],
        values=[0.0, 0.0],
        last_value=0.0,
        terminated=[1],
        steps=[3, 2],
        chunk=3,
    )
    gamma = 0.9
    _, ret = compute_gae(**kwargs, gamma=gamma, gae_lambda=1.0, reward_type="action")
    per_step = [1.0, 2.0, 3.0, 4.0, 5.0]
    mc = sum(gamma**i * r for i, r in enumerate(per_step))
    assert ret[0, 0].item() == pytest.approx(mc)
    assert ret[1, 0].item() == pytest.approx(4.0 + gamma * 5.0)
    _, ret_chunk = compute_gae(**kwargs, gamma=gamma, gae_lambda=1.0, reward_type="chunk")
    assert ret_chunk[0, 0].item() == pytest.approx(6.0 + gamma * 9.0)
    assert not math.isclose(ret_chunk[0, 0].item(), ret[0, 0].item())


def test_gae_needs_last_value():
    rollout, _ = random_rollout(4, 2, 2, seed=0)
    with pytest.raises(ValueError, match="last_value"):
        gae_advantages(rollout, None, AlgoConfig())
