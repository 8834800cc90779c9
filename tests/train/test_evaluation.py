"""evaluate_policy: a seeded evaluation repeats itself and leaves the caller's random stream alone; the
env's episode flags are averaged next to success."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from embodrl.train.evaluation import eval_metrics, evaluate_policy, summarize
from tests.data.counting_env import FLAG, INSTRUCTIONS, TASKS, CountingEnv


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


def test_episode_flags_are_averaged_overall_and_per_instruction():
    # episodes from states 0..5 on 2 envs; the flag is set from states 0 and 4, both of instruction 0
    results = evaluate_policy(NoisyPolicy(), CountingEnv(num_envs=2, image=False, flags=True), episodes=6)
    assert results.flags == {FLAG: [True, False, False, False, True, False]}
    summary = summarize(results)
    assert summary["flags"][FLAG]["rate"] == eval_metrics(results)[f"eval/{FLAG}"] == 2 / 6
    assert summary["flags"][FLAG]["per_instruction"] == {INSTRUCTIONS[0]: 2 / 3, INSTRUCTIONS[1]: 0.0}
    plain = evaluate_policy(NoisyPolicy(), CountingEnv(num_envs=2, image=False), episodes=6)
    assert plain.flags == {} and summarize(plain)["flags"] == {}
    assert set(eval_metrics(plain)) == {"eval/success", "eval/length", "eval/return"}
    assert summarize(plain)["per_task"] == {}  # an env that names no tasks


def test_multi_task_envs_get_success_and_flags_per_task():
    # states 0..5: instruction s % 2 (task TASKS[s % 2]); state 4 fails; the flag is set from states 0, 4
    env = CountingEnv(num_envs=2, image=False, flags=True, tasks=True)
    summary = summarize(evaluate_policy(NoisyPolicy(), env, episodes=6))
    assert summary["per_task"] == {TASKS[0]: 2 / 3, TASKS[1]: 1.0}
    assert summary["flags"][FLAG]["per_task"] == {TASKS[0]: 2 / 3, TASKS[1]: 0.0}
    metrics = eval_metrics(evaluate_policy(NoisyPolicy(), env, episodes=6))
    assert metrics[f"eval/task/{TASKS[0]}"] == 2 / 3 and metrics[f"eval/task/{TASKS[1]}"] == 1.0
