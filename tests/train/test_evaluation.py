"""evaluate_policy: a seeded evaluation repeats itself and leaves the caller's random stream alone."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from embodrl.train.evaluation import evaluate_policy
from tests.data.counting_env import CountingEnv


class NoisyPolicy(nn.Module):
    """Draws its actions from torch's RNG even when deterministic, as flow policies draw their start noise."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.draws: list[torch.Tensor] = []

    def act(self, obs, deterministic: bool = False):
        actions = torch.randn(obs.batch_size[0], 1, 3) * self.scale.detach()
        self.draws.append(actions)
        return SimpleNamespace(actions=actions)


def play(policy: NoisyPolicy, seed: int) -> torch.Tensor:
    policy.draws = []
    evaluate_policy(policy, CountingEnv(num_envs=2, image=False), episodes=4, seed=seed)
    return torch.cat(policy.draws)


def test_a_seeded_evaluation_repeats_its_draws_and_restores_the_callers_rng():
    policy = NoisyPolicy()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    first = play(policy, seed=0)
    assert torch.equal(torch.get_rng_state(), before)  # training continues as if nothing had been drawn
    torch.manual_seed(456)  # whatever the caller's stream is, the evaluation is the same
    assert torch.equal(play(policy, seed=0), first)
    assert not torch.equal(play(policy, seed=1), first)
