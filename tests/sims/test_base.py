import torch
from tensordict import TensorDict

from sims.base import StepResult


def test_step_result_as_tensordict_shares_its_tensors_and_round_trips():
    obs = TensorDict(
        {"state": torch.randn(3, 4), "task_id": torch.zeros(3, dtype=torch.long)}, batch_size=[3]
    )
    result = StepResult(
        obs=obs,
        reward=torch.randn(3, 2),
        terminated=torch.tensor([True, False, False]),
        truncated=torch.tensor([False, True, False]),
        success=torch.tensor([True, False, False]),
        final_obs=obs.clone(),
        steps_executed=torch.tensor([1, 2, 2]),
        batch_size=[3],
    )
    payload = result.as_tensordict()
    assert set(payload.keys()) == {
        "obs",
        "reward",
        "terminated",
        "truncated",
        "success",
        "final_obs",
        "steps_executed",
        "episode_flags",
    }
    assert list(result.episode_flags.keys()) == [] and result.episode_flags.batch_size == (3,)  # no flags
    assert payload["reward"].data_ptr() == result.reward.data_ptr()  # no copy per step
    assert payload["obs", "state"].data_ptr() == obs["state"].data_ptr()
    back = StepResult.from_tensordict(payload)
    assert torch.equal(back.done, torch.tensor([True, True, False]))
    assert torch.equal(back.final_obs["state"], obs["state"]) and torch.equal(back.reward, result.reward)


def test_step_result_build_carries_episode_flags_through_a_channel_and_concatenation():
    obs = TensorDict({"state": torch.zeros(2, 1)}, batch_size=[2])
    no = torch.zeros(2, dtype=torch.bool)
    fields = dict(obs=obs, reward=torch.zeros(2, 1), terminated=no, truncated=no, success=no, final_obs=obs)
    plain = StepResult.build(**fields, steps_executed=torch.ones(2, dtype=torch.long), device=None)
    assert list(plain.episode_flags.keys()) == []
    flag = torch.tensor([True, False])
    flagged = StepResult.build(
        **fields, steps_executed=torch.ones(2, dtype=torch.long), device=None, episode_flags={"moved": flag}
    )
    back = StepResult.from_tensordict(flagged.as_tensordict())
    assert torch.equal(torch.cat([back, back]).episode_flags["moved"], flag.repeat(2))
