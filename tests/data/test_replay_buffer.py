"""The replay buffer: the ring, its saved state, the demo share of a batch, demos read as transitions."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from embodrl.data.lerobot_dataset import LeRobotDatasetWriter
from embodrl.data.replay_buffer import ReplayBuffer, demo_transitions, mixed_batch
from embodrl.errors import UserError


def transitions(first: int, count: int) -> TensorDict:
    """Transitions numbered first..first+count-1 (in their reward), with a nested observation."""
    ids = torch.arange(first, first + count, dtype=torch.float32)
    return TensorDict(
        {
            "obs": {"state": ids[:, None].expand(count, 3).clone()},
            "action": ids[:, None, None].expand(count, 1, 2).clone(),
            "reward": ids,
            "next_obs": {"state": ids[:, None].expand(count, 3) + 1},
            "terminated": ids % 2 == 0,
        },
        batch_size=[count],
    )


def test_ring_keeps_the_newest():
    buffer = ReplayBuffer(5)
    buffer.add(transitions(0, 3))
    buffer.add(transitions(3, 4))  # wraps: 0 and 1 are replaced
    assert len(buffer) == 5 and buffer.cursor == 2
    assert sorted(buffer.data["reward"].tolist()) == [2, 3, 4, 5, 6]
    buffer.add(transitions(7, 12))  # more than fit at once: the last 5
    assert sorted(buffer.data["reward"].tolist()) == [14, 15, 16, 17, 18]
    sample = buffer.sample(64, torch.Generator().manual_seed(0))
    assert set(sample["reward"].tolist()) <= {14, 15, 16, 17, 18}
    torch.testing.assert_close(sample["obs", "state"][:, 0], sample["reward"])


def test_saved_state_restores_the_same_draws_and_the_same_ring_position():
    buffer = ReplayBuffer(6)
    buffer.add(transitions(0, 8))
    saved = io.BytesIO()
    torch.save(buffer.state_dict(), saved)  # as a checkpoint stores it: plain tensors
    saved.seek(0)
    restored = ReplayBuffer(6)
    restored.load_state_dict(torch.load(saved, weights_only=True))
    assert (len(restored), restored.cursor) == (len(buffer), buffer.cursor)
    draws = [b.sample(10, torch.Generator().manual_seed(4)) for b in (buffer, restored)]
    assert (draws[0] == draws[1]).all()
    for b in (buffer, restored):
        b.add(transitions(100, 1))
    assert (buffer.data == restored.data).all()
    with pytest.raises(UserError, match="buffer_size"):
        ReplayBuffer(7).load_state_dict(buffer.state_dict())
    empty = ReplayBuffer(3)
    empty.load_state_dict(ReplayBuffer(3).state_dict())
    assert len(empty) == 0


def test_a_checkpoint_stores_the_filled_rows_not_the_capacity():
    buffer = ReplayBuffer(100_000)
    buffer.add(transitions(0, 3))
    saved = io.BytesIO()
    torch.save(buffer.state_dict(), saved)
    assert len(saved.getvalue()) < 20_000  # the 100k preallocated rows would be megabytes


def test_mixed_batch_takes_the_demo_ratio_from_the_demos():
    online, demos = ReplayBuffer(100), ReplayBuffer(100)
    online.add(transitions(0, 50))
    demos.add(transitions(1000, 20))
    g = torch.Generator().manual_seed(0)
    half = mixed_batch(online, demos, 256, 0.5, g)
    assert half.batch_size[0] == 256 and int((half["reward"] >= 1000).sum()) == 128
    assert torch.equal(half["demo"], half["reward"] >= 1000)  # the demos' rows are marked
    quarter = mixed_batch(online, demos, 100, 0.25, g)
    assert int((quarter["reward"] >= 1000).sum()) == 25
    assert int((mixed_batch(online, None, 64, 0.5, g)["reward"] >= 1000).sum()) == 0


def test_demos_become_transitions_with_a_success_at_each_episode_end(tmp_path):
    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
    }
    lengths = (4, 3)
    rng = np.random.default_rng(0)
    episodes = [
        {"observation.state": rng.normal(size=(n, 3)).astype(np.float32), "action": rng.normal(size=(n, 2))}
        for n in lengths
    ]
    with LeRobotDatasetWriter(tmp_path / "demos", 10, features) as writer:
        for episode in episodes:
            writer.add_episode({k: v.astype(np.float32) for k, v in episode.items()}, "reach")
    demos = demo_transitions(str(tmp_path / "demos"), ("state",))
    assert demos.batch_size[0] == 7 and demos["action"].shape == (7, 1, 2)
    assert demos["reward"].tolist() == [0, 0, 0, 1, 0, 0, 1]
    assert demos["terminated"].tolist() == [False, False, False, True, False, False, True]
    states = np.concatenate([e["observation.state"] for e in episodes])
    torch.testing.assert_close(demos["obs", "state"], torch.as_tensor(states))
    torch.testing.assert_close(demos["next_obs", "state"][:3], torch.as_tensor(states[1:4]))  # same episode
    torch.testing.assert_close(demos["next_obs", "state"][4], torch.as_tensor(states[5]))
    with pytest.raises(UserError, match="none were given"):
        demo_transitions(str(tmp_path / "demos"), ("rgb",))
    first = demo_transitions(str(tmp_path / "demos"), ("state",), episodes=1)
    assert first["reward"].tolist() == [0, 0, 0, 1]  # the first episode alone


def test_a_recording_with_an_intervention_flag_gives_the_flagged_frames(tmp_path):
    """`embodrl deploy` marks the steps a human drove (`teleop`): only those are demonstrations."""
    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
        "teleop": {"dtype": "bool", "shape": [1], "names": None},
    }
    state = np.arange(15, dtype=np.float32).reshape(5, 3)
    episode = {
        "observation.state": state,
        "action": np.zeros((5, 2), np.float32),
        "teleop": np.array([[False], [True], [True], [False], [False]]),
    }
    with LeRobotDatasetWriter(tmp_path / "rec", 10, features) as writer:
        writer.add_episode(episode, "pick")
    demos = demo_transitions(str(tmp_path / "rec"), ("state",))
    assert demos.batch_size[0] == 2
    torch.testing.assert_close(demos["obs", "state"], torch.as_tensor(state[1:3]))
    torch.testing.assert_close(demos["next_obs", "state"], torch.as_tensor(state[2:4]))  # where they led
