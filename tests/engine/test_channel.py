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
