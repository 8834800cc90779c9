import pytest
import torch

from embodrl.algos.advantage import compute_advantages, normalize_advantages, segment_lengths
from embodrl.algos.config import AlgoConfig
from tests.algos.rollouts import random_rollout


def test_segment_lengths_count_steps_per_episode_in_the_window():
    done = torch.tensor([[0, 1], [1, 0], [0, 0], [0, 1], [0, 0]], dtype=torch.bool)  # [T=5, N=2]
    assert segment_lengths(done).tolist() == [[2, 1], [2, 3], [3, 3], [3, 3], [3, 1]]


def test_normalization_uses_valid_entries_only():
    adv = torch.tensor([1.0, 3.0, 100.0])
    mask = torch.tensor([True, True, False])
    out = normalize_advantages(adv, mask, eps=0.0)
    assert out.tolist() == pytest.approx([-(2**-0.5), 2**-0.5, 0.0])
    assert normalize_advantages(adv, torch.tensor([True, False, False]), 1e-6).tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("name", ["ppo", "grpo"])
def test_compute_advantages_dispatches_by_name_and_normalizes(name):
    rollout, last_value = random_rollout(10, 6, 2, seed=3, p_term=0.3)
    out = compute_advantages(rollout, last_value, AlgoConfig(name=name, group_size=2))
    valid = out.advantages[out.mask]
    assert valid.numel() > 1
    assert valid.mean().abs() < 1e-5 and (valid.std() - 1).abs() < 1e-4
    td = out.to_tensordict()
    assert td.batch_size == (10, 6) and set(td.keys()) == {"advantages", "returns", "mask", "traj_length"}
    raw = compute_advantages(
        rollout, last_value, AlgoConfig(name=name, group_size=2, normalize_advantages=False)
    )
    assert not torch.allclose(raw.advantages, out.advantages)
