import pytest
import torch
from tensordict import TensorDict

from embodrl.engine.channel import ChannelTimeout, Header, make_channel
from embodrl.errors import ConfigError


@pytest.mark.parametrize("transport", ["inproc", "multiprocess"])
def test_channel_carries_typed_headers_and_nested_tensordicts_in_order(transport):
    channel = make_channel(transport)
    obs = TensorDict({"rgb": torch.randint(0, 255, (2, 4, 4, 3), dtype=torch.uint8)}, batch_size=[2])
    payload = TensorDict({"obs": obs, "reward": torch.tensor([[0.5], [1.0]])}, batch_size=[2])
    channel.put(Header("step", stage=1, version=7, step=3, info={"env_step": 0.1}), payload)
    channel.put(Header("close"))
    header, got = channel.get(timeout=10)
    assert header == Header("step", 1, 7, 3, {"env_step": 0.1})
    assert torch.equal(got["obs", "rgb"], obs["rgb"]) and torch.equal(got["reward"], payload["reward"])
    assert channel.get(timeout=10) == (Header("close"), None)
    with pytest.raises(ChannelTimeout):
        channel.get(timeout=0.05)


def test_unknown_transport_is_a_config_error():
    with pytest.raises(ConfigError, match="inproc, inline, multiprocess, ray"):
        make_channel("carrier-pigeon")


def _numbered(i: int, n: int) -> TensorDict:
    nested = {"y": torch.arange(n) + i}
    return TensorDict({"x": torch.full((n, 4), float(i)), "nested": nested}, batch_size=[n])


def test_multiprocess_channel_reuses_shared_slots_and_hands_out_copies():
    channel = make_channel("multiprocess")
    received = []
    for i in range(6):  # two layouts, interleaved; each message read before the next is sent
        channel.put(Header("step", step=i), _numbered(i, 2 + i % 2))
        received.append(channel.get(timeout=10))
    for i in range(6, 9):  # three in flight at once: each needs a slot of its own
        channel.put(Header("step", step=i), _numbered(i, 2))
    received += [channel.get(timeout=10) for _ in range(3)]
    for i, (header, got) in enumerate(received):
        n = 2 + i % 2 if i < 6 else 2
        assert header.step == i and got.batch_size == torch.Size([n])
        assert torch.equal(got["x"], torch.full((n, 4), float(i))), i  # later messages did not overwrite it
        assert torch.equal(got["nested", "y"], torch.arange(n) + i)
        assert not got.is_shared()  # a copy: the slot goes back to the sender
    assert sorted(len(slots) for slots in channel._slots.values()) == [1, 3]


@pytest.mark.parametrize("transport", ["inproc", "multiprocess"])
def test_channels_count_the_seconds_spent_moving_payloads(transport):
    channel = make_channel(transport)
    channel.put(Header("step"), _numbered(0, 64))
    channel.get(timeout=10)
    moved = channel.pop_transfer_s()
    if transport == "inproc":  # a reference crosses between threads: nothing is copied
        assert moved == 0.0
    else:  # copied into a shared slot and out of it
        assert moved > 0.0
    assert channel.pop_transfer_s() == 0.0  # popped: counting starts again


def test_multiprocess_channel_copies_payloads_that_bypass_the_slots():
    """Off-CPU tensors (CUDA) and non-tensor entries travel through the queue as the sender's shared memory;
    the receiver keeps a copy of its own, so nothing it holds depends on the sender staying alive."""
    channel = make_channel("multiprocess")
    payload = TensorDict({"x": torch.arange(4.0)}, batch_size=[4])
    payload.set_non_tensor("note", "no slot for me")
    channel.put(Header("step"), payload)
    header, got = channel.get(timeout=10)
    assert torch.equal(got["x"], payload["x"]) and got["note"] == "no slot for me"
    assert not got["x"].is_shared()
    assert channel._slots == {}  # it did bypass the slots
