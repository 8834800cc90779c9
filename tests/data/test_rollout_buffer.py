import pytest
import torch
from tensordict import TensorDict

from embodrl.algos.advantage import compute_advantages
from embodrl.algos.config import AlgoConfig
from embodrl.data.rollout_buffer import RolloutBuffer

T, N, C, A = 5, 6, 3, 2


def _transition(t: int) -> TensorDict:
    ids = torch.arange(N) + t * N  # a unique id per sample, to check coverage
    return TensorDict(
        {
            "obs": TensorDict({"state": ids[:, None].float().expand(N, 4)}, batch_size=[N]),
            "actions": torch.zeros(N, C, A),
            "logprob": torch.randn(N, C, A),
            "value": torch.randn(N),
            "replay": TensorDict({"chain": torch.randn(N, 3, C, A), "id": ids}, batch_size=[N]),
            "reward": torch.rand(N, C),
            "steps_executed": torch.full((N,), C),
            "terminated": ids % 7 == 0,
            "truncated": ids % 11 == 0,
            "success": ids % 7 == 0,
            "episode_flags": TensorDict({"flag": ids % 5 == 0}, batch_size=[N]),
            "bootstrap_value": torch.randn(N),
        },
        batch_size=[N],
    )


def _filled() -> RolloutBuffer:
    buffer = RolloutBuffer(T, N)
    for t in range(T):
        buffer.add(_transition(t))
    buffer.set_last_value(torch.zeros(N))
    return buffer


def test_storage_is_a_tensordict_over_steps_and_envs():
    buffer = _filled()
    assert buffer.full
    assert buffer.data.batch_size == (T, N)
    assert buffer.data["obs", "state"].shape == (T, N, 4)
    assert buffer.data["replay", "chain"].shape == (T, N, 3, C, A)
    assert buffer.data["reward"].shape == (T, N, C)
    assert buffer.data["replay", "id"][2].tolist() == list(range(2 * N, 3 * N))


@pytest.mark.parametrize("minibatch_size", [7, 10, 30, 64])
def test_each_epoch_covers_every_sample_exactly_once(minibatch_size):
    buffer = _filled()
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        seen = [mb["replay", "id"] for mb in buffer.minibatches(minibatch_size, gen)]
        assert all(len(ids) <= minibatch_size for ids in seen)
        assert sorted(torch.cat(seen).tolist()) == list(range(T * N))
        # Fields of a sample stay together after flattening and shuffling.
        for mb in buffer.minibatches(minibatch_size, gen):
            assert torch.equal(mb["obs", "state"][:, 0].long(), mb["replay", "id"])


def test_minibatch_order_is_reproducible_with_the_same_seed():
    buffer = _filled()

    def order(seed):
        gen = torch.Generator().manual_seed(seed)
        return torch.cat([mb["replay", "id"] for mb in buffer.minibatches(8, gen)]).tolist()

    assert order(1) == order(1)
    assert order(1) != order(2)


def test_advantages_merge_into_the_rollout_and_reach_minibatches():
    buffer = _filled()
    out = compute_advantages(buffer.data, buffer.last_value, AlgoConfig())
    buffer.data.update(out.to_tensordict())
    mb = next(buffer.minibatches(T * N, torch.Generator().manual_seed(0)))
    flat_ids = mb["replay", "id"]
    torch.testing.assert_close(mb["advantages"], out.advantages.flatten()[flat_ids])
    assert mb["mask"].dtype == torch.bool


def test_clear_reuses_storage_and_misuse_is_reported():
    buffer = _filled()
    with pytest.raises(RuntimeError, match="clear"):
        buffer.add(_transition(0))
    storage = buffer.data
    buffer.clear()
    assert buffer.step == 0 and buffer.last_value is None
    with pytest.raises(RuntimeError, match="fill it first"):
        next(buffer.minibatches(4, torch.Generator()))
    buffer.add(_transition(9))
    assert buffer.data is storage and buffer.data["replay", "id"][0, 0] == 9 * N
    with pytest.raises(KeyError, match="bootstrap_value"):
        buffer.add(_transition(1).exclude("bootstrap_value"))
    with pytest.raises(ValueError, match="batch"):
        buffer.add(_transition(1)[:2])
