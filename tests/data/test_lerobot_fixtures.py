"""embodrl's reader on datasets that LeRobot 0.4.4 itself wrote (scripts/lerobot_fixtures.py): features,
shapes, episodes, tasks, statistics, and camera frames decoded from AV1 video and from parquet images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embodrl.data.lerobot_dataset import LeRobotDataset
from tests.data.robot_dataset import SO100_MOTORS

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "lerobot"
BACKGROUND = np.array([96, 96, 128])  # the fixtures' background colour
# (name, fps, episodes, frames per episode, state dim, action dim, cameras {key: (H, W)}, tasks)
DATASETS = {
    "so100_video": (
        15,
        4,
        24,
        6,
        6,
        {"observation.images.front": (64, 64), "observation.images.wrist": (48, 64)},
        ["pick up the red block", "push the red block to the left"],
    ),
    "images_parquet": (
        10,
        3,
        20,
        8,
        7,
        {"observation.images.top": (48, 48)},
        ["reach the green marker", "lift the green marker"],
    ),
}


@pytest.fixture(scope="module", params=sorted(DATASETS))
def dataset(request) -> tuple[str, LeRobotDataset]:
    return request.param, LeRobotDataset(FIXTURES / request.param)


def test_features_episodes_and_tasks(dataset):
    name, ds = dataset
    fps, episodes, length, state_dim, action_dim, cameras, tasks = DATASETS[name]
    assert ds.info["codebase_version"] == "v3.0"
    assert ds.fps == fps
    assert ds.num_episodes == episodes and ds.num_frames == episodes * length
    assert [ds.episode_range(e) for e in range(episodes)] == [
        (e * length, (e + 1) * length) for e in range(episodes)
    ]
    assert ds.tasks == tasks
    assert sorted(ds.camera_keys) == sorted(cameras)
    video = name == "so100_video"
    for key, (h, w) in cameras.items():
        assert ds.features[key]["dtype"] == ("video" if video else "image")
        assert ds.features[key]["shape"] == [h, w, 3]
    assert ds.column("observation.state").shape == (episodes * length, state_dim)
    assert ds.column("action").shape == (episodes * length, action_dim)
    assert ds.column("observation.state").dtype == np.float32
    if video:
        assert ds.info["robot_type"] == "so100_follower"
        assert ds.features["observation.state"]["names"] == list(SO100_MOTORS)
        assert ds.features["action"]["names"] == list(SO100_MOTORS)
        assert ds.features["observation.images.front"]["info"]["video.codec"] == "av1"
    # LeRobot's statistics, quantiles included, per feature
    for key, dim in (("observation.state", state_dim), ("action", action_dim)):
        stats = ds.stats[key]
        assert {"mean", "std", "min", "max", "q01", "q99"} <= set(stats)
        np.testing.assert_allclose(stats["mean"], ds.column(key).mean(0), rtol=1e-4, atol=1e-4)
        assert stats["q01"].shape == (dim,)


def test_episodes_are_consistent_trajectories(dataset):
    """Rows come back in episode order: in each episode the next state is the commanded action."""
    name, ds = dataset
    _, episodes, length, _, action_dim, _, tasks = DATASETS[name]
    for e in range(episodes):
        ep = ds.episode(e)
        assert ep["task"] == tasks[e % len(tasks)]
        np.testing.assert_array_equal(ep["frame_index"], np.arange(length))
        np.testing.assert_allclose(ep["timestamp"], np.arange(length) / ds.fps, atol=1e-6)
        np.testing.assert_allclose(ep["observation.state"][1:, :action_dim], ep["action"][:-1], atol=1e-5)


def blob_centre(frame: np.ndarray, colour: np.ndarray) -> np.ndarray:
    """Centre (x, y) of the pixels near `colour`."""
    near = np.abs(frame.astype(int) - colour).sum(-1) < 90
    assert near.sum() >= 8, "the coloured blob is missing from the decoded frame"
    ys, xs = np.nonzero(near)
    return np.array([xs.mean(), ys.mean()])


def test_camera_frames_decode(dataset):
    """Every frame decodes at its declared size; the background is the one drawn (exactly for PNG, within
    AV1's loss for video) and the blob moves through the episode."""
    name, ds = dataset
    _, episodes, length, _, _, cameras, _ = DATASETS[name]
    lossless = name == "images_parquet"
    first = next(iter(cameras))  # the camera that shows the task-coloured blob
    for e in range(episodes):
        for key, (h, w) in cameras.items():
            frames = ds.camera_frames(key, e)
            assert frames.shape == (length, h, w, 3) and frames.dtype == np.uint8
            corner = frames[:, 0, 0].astype(int)
            if lossless:
                assert (corner == BACKGROUND).all()
            else:
                assert np.abs(corner - BACKGROUND).max() <= 12
        colour = np.array([220, 40, 40]) if e % 2 == 0 else np.array([40, 200, 60])
        frames = ds.camera_frames(first, e)
        path = np.stack([blob_centre(f, colour) for f in frames])
        assert np.linalg.norm(path[-1] - path[0]) > 8.0, "the blob should cross the image in an episode"
    one = ds.frame(length + 3)  # episode 1, frame 3: the same pixels as through the episode
    np.testing.assert_array_equal(one[first], ds.camera_frames(first, 1)[3])
