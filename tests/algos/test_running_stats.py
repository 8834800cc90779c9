import pytest
import torch
from tensordict import TensorDict

from embodrl.algos.running_stats import RewardScaler, RunningMeanStd, RunningObsNormalization
from embodrl.errors import UserError
from embodrl.policies.normalization import Normalizer


def test_merged_batches_give_the_stats_of_all_samples():
    g = torch.Generator().manual_seed(0)
    data = torch.randn(300, 3, generator=g, dtype=torch.float64) * 4 + 7
    stats = RunningMeanStd((3,), count=0.0)
    for batch in data.split([1, 50, 249]):
        stats.update(batch)
    assert stats.count == 300
    torch.testing.assert_close(stats.mean, data.mean(0))
    torch.testing.assert_close(stats.var, data.var(0, unbiased=False))


def _scale_step_by_step(scaler_state, reward, steps, done, gamma, clip, eps=1e-8):
    """SB3 VecNormalize's reward path, one env step at a time (the reference)."""
    stats, ret = scaler_state
    num_steps, num_envs, chunk = reward.shape
    out = torch.zeros_like(reward, dtype=torch.float64)
    for t in range(num_steps):
        for c in range(chunk):
            live = c < steps[t]  # [N]
            if live.any():
                ret = torch.where(live, ret * gamma + reward[t, :, c].double(), ret)
                stats.update(ret[live])
                out[t, :, c] = torch.where(live, reward[t, :, c] / (stats.var + eps).sqrt(), 0.0)
        ret = torch.where(done[t], 0.0, ret)  # the episode ended inside decision t
    return out.clamp(-clip, clip), ret


def test_reward_scaling_equals_the_per_step_wrapper_across_rollouts():
    g = torch.Generator().manual_seed(1)
    num_steps, num_envs, chunk, gamma, clip = 12, 3, 2, 0.9, 1.5
    scaler = RewardScaler(gamma, clip)
    reference = (RunningMeanStd(), torch.zeros(num_envs, dtype=torch.float64))
    largest = 0.0
    for _ in range(3):  # the running return and stats carry from one rollout to the next
        reward = torch.randn(num_steps, num_envs, chunk, generator=g) * 5
        done = torch.rand(num_steps, num_envs, generator=g) < 0.2
        steps = torch.where(done & (torch.rand(num_steps, num_envs, generator=g) < 0.5), 1, chunk)
        reward[..., 1] = torch.where(steps > 1, reward[..., 1], 0.0)
        got = scaler.scale(reward, steps, done, continues=True)
        expected, ret = _scale_step_by_step(reference, reward, steps, done, gamma, clip)
        reference = (reference[0], ret)
        torch.testing.assert_close(got, expected.float())
        torch.testing.assert_close(scaler.returns, ret)
        largest = max(largest, got.abs().max().item())
    assert largest == clip  # clipping happened and bounds the rewards
    assert scaler.stats.count == pytest.approx(reference[0].count)


def test_reward_scaler_restarts_returns_when_episodes_do_not_continue():
    scaler = RewardScaler(0.99, 10.0)
    reward = torch.ones(4, 2, 1)
    steps, done = torch.ones(4, 2, dtype=torch.long), torch.zeros(4, 2, dtype=torch.bool)
    scaler.scale(reward, steps, done, continues=True)
    assert (scaler.returns > 0).all()
    state = scaler.state_dict()
    fresh = RewardScaler(0.99, 10.0)
    fresh.load_state_dict(state)
    torch.testing.assert_close(
        fresh.scale(reward, steps, done, continues=False), scaler.scale(reward, steps, done, continues=False)
    )
    assert scaler.returns.tolist() == pytest.approx([sum(0.99**k for k in range(4))] * 2)


def test_obs_normalization_writes_running_stats_into_the_policy_normalizers():
    state, action = Normalizer("state", 2, "mean_std", clip=5.0), Normalizer("action", 2, "mean_std")
    running = RunningObsNormalization({"state": state, "action": action})
    obs = torch.tensor([[1.0, 10.0], [3.0, 10.0], [5.0, 10.0], [7.0, 10.0]]).reshape(2, 2, 2)  # [T, N, D]
    running.update(TensorDict({"state": obs}, batch_size=[2, 2]))
    assert state.mean.tolist() == pytest.approx([4.0, 10.0], abs=1e-3)
    assert state.std[0].item() == pytest.approx(5**0.5, rel=1e-3)
    assert action.mean.tolist() == [0.0, 0.0]  # actions are not observations
    assert state(torch.tensor([1000.0, 10.0])).tolist() == pytest.approx([5.0, 0.0], abs=1e-2)  # clipped
    assert set(running.state_dict()) == {"state"}


def test_obs_normalization_needs_mean_std_normalizers():
    with pytest.raises(UserError, match="state_normalization=mean_std"):
        RunningObsNormalization({"state": Normalizer("state", 2, "quantile")})


def test_reduce_over_ranks_pools_every_ranks_samples():
    """Two ranks with the same data (reduce doubles every sum) equal one process holding both copies."""
    g = torch.Generator().manual_seed(2)
    twice = lambda x: 2 * x  # noqa: E731 - the all-reduce sum of two identical ranks
    data = torch.randn(40, 3, generator=g, dtype=torch.float64)
    pooled, both = RunningMeanStd((3,)), RunningMeanStd((3,))
    pooled.update(data, reduce=twice)
    both.update(torch.cat([data, data]))
    assert pooled.count == both.count
    torch.testing.assert_close(pooled.mean, both.mean)
    torch.testing.assert_close(pooled.var, both.var)

    reward = torch.randn(10, 2, 1, generator=g) * 3
    steps, done = torch.ones(10, 2, dtype=torch.long), torch.rand(10, 2, generator=g) < 0.3
    per_rank = RewardScaler(0.95, 10.0).scale(reward, steps, done, continues=True, reduce=twice)
    in_one = RewardScaler(0.95, 10.0).scale(
        torch.cat([reward, reward], 1),
        torch.cat([steps, steps], 1),
        torch.cat([done, done], 1),
        continues=True,
    )
    torch.testing.assert_close(per_rank, in_one[:, :2])
