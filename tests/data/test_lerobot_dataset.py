"""LeRobotDataset v3.0: a spec fixture written here by hand, writer -> reader round trips, chunk samples."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from embodrl.data import lerobot_format
from embodrl.data.chunk_dataset import ActionChunkDataset, collate_chunks
from embodrl.data.lerobot_dataset import LeRobotDataset, LeRobotDatasetWriter, video_times
from embodrl.errors import UserError

FPS = 10
VIDEO_MAE = 6.0  # mean absolute error allowed after lossy encoding, in uint8 levels


def _frames(length: int, seed: int, size: int = 32) -> np.ndarray:
    """Smooth images with a moving square: compressible, yet every frame differs."""
    rng = np.random.default_rng(seed)
    frames = np.zeros((length, size, size, 3), np.uint8)
    frames[..., 0] = np.linspace(0, 200, size, dtype=np.uint8)[None, None, :]
    frames[..., 2] = rng.integers(40, 200)
    for t in range(length):
        frames[t, 8:16, t : t + 8, 1] = 250
    return frames


# ---- a dataset written per LeRobot's published v3.0 layout, without our writer ----------------------------
def _write_spec_fixture(root: Path, lengths: list[int], tasks: list[str]) -> dict:
    """Two-file data, one concatenated h264 video, tasks.parquet with an unnamed pandas index."""
    rng = np.random.default_rng(0)
    total = sum(lengths)
    states = rng.normal(size=(total, 3)).astype(np.float32)
    actions = rng.uniform(-1, 1, size=(total, 2)).astype(np.float32)
    images = np.concatenate([_frames(n, seed=i) for i, n in enumerate(lengths)])
    starts = np.cumsum([0, *lengths])
    episode_of = np.repeat(np.arange(len(lengths)), lengths)
    frame_index = np.concatenate([np.arange(n) for n in lengths])
    task_of_episode = [i % len(tasks) for i in range(len(lengths))]

    # data: episode 0 in file-000, the rest in file-001; variable-size lists as some writers produce.
    for file_index, episodes in enumerate([[0], list(range(1, len(lengths)))]):
        rows = np.concatenate([np.arange(starts[e], starts[e + 1]) for e in episodes])
        table = pa.table(
            {
                "observation.state": pa.array(states[rows].tolist(), pa.list_(pa.float32())),
                "action": pa.array(actions[rows].tolist(), pa.list_(pa.float32())),
                "timestamp": pa.array((frame_index[rows] / FPS).astype(np.float32)),
                "frame_index": pa.array(frame_index[rows]),
                "episode_index": pa.array(episode_of[rows]),
                "index": pa.array(rows.astype(np.int64)),
                "task_index": pa.array(np.array(task_of_episode)[episode_of[rows]].astype(np.int64)),
            }
        )
        path = root / f"data/chunk-000/file-{file_index:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)

    # videos: all episodes in one h264 file, back to back.
    video = root / "videos/observation.images.top/chunk-000/file-000.mp4"
    video.parent.mkdir(parents=True)
    with av.open(str(video), "w") as container:
        stream = container.add_stream("libx264", rate=FPS, options={"crf": "18", "g": "4"})
        stream.width = stream.height = 32
        stream.pix_fmt = "yuv420p"
        for image in images:
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)

    # tasks: what pandas writes for DataFrame({"task_index": ...}, index=tasks) with an unnamed index.
    tasks_table = pa.table(
        {"task_index": pa.array(range(len(tasks)), pa.int64()), "__index_level_0__": tasks}
    )
    (root / "meta/episodes/chunk-000").mkdir(parents=True)
    pq.write_table(tasks_table, root / "meta/tasks.parquet")

    episodes = pa.table(
        {
            "episode_index": list(range(len(lengths))),
            "tasks": [[tasks[t]] for t in task_of_episode],
            "length": lengths,
            "data/chunk_index": [0] * len(lengths),
            "data/file_index": [0] + [1] * (len(lengths) - 1),
            "dataset_from_index": starts[:-1].tolist(),
            "dataset_to_index": starts[1:].tolist(),
            "videos/observation.images.top/chunk_index": [0] * len(lengths),
            "videos/observation.images.top/file_index": [0] * len(lengths),
            "videos/observation.images.top/from_timestamp": (starts[:-1] / FPS).tolist(),
            "videos/observation.images.top/to_timestamp": (starts[1:] / FPS).tolist(),
            "meta/episodes/chunk_index": [0] * len(lengths),
            "meta/episodes/file_index": [0] * len(lengths),
            "stats/action/mean": [
                actions[starts[e] : starts[e + 1]].mean(0).tolist() for e in range(len(lengths))
            ],
        }
    )
    pq.write_table(episodes, root / "meta/episodes/chunk-000/file-000.parquet")
    scalar = {"dtype": "int64", "shape": [1], "names": None}
    info = {
        "codebase_version": "v3.0",
        "robot_type": "fixture_arm",
        "total_episodes": len(lengths),
        "total_frames": total,
        "total_tasks": len(tasks),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 500,
        "fps": FPS,
        "splits": {"train": f"0:{len(lengths)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": {
            "observation.state": {"dtype": "float32", "shape": [3], "names": ["x", "y", "z"]},
            "action": {"dtype": "float32", "shape": [2], "names": ["vx", "vy"]},
            "observation.images.top": {
                "dtype": "video",
                "shape": [32, 32, 3],
                "names": ["height", "width", "channels"],
                "info": {"video.fps": FPS, "video.codec": "h264", "video.pix_fmt": "yuv420p"},
            },
            "timestamp": {"dtype": "float32", "shape": [1], "names": None},
            "frame_index": scalar,
            "episode_index": scalar,
            "index": scalar,
            "task_index": scalar,
        },
    }
    (root / "meta/info.json").write_text(json.dumps(info))
    action_stats = {"mean": actions.mean(0).tolist(), "std": actions.std(0).tolist()}
    (root / "meta/stats.json").write_text(json.dumps({"action": action_stats}))
    return {
        "states": states,
        "actions": actions,
        "images": images,
        "starts": starts,
        "tasks": task_of_episode,
    }


def test_reads_a_dataset_written_per_the_v3_spec(tmp_path):
    lengths, tasks = [6, 9, 4], ["pick up the cube", "open the drawer"]
    truth = _write_spec_fixture(tmp_path, lengths, tasks)
    ds = LeRobotDataset(tmp_path)
    assert (ds.num_episodes, ds.num_frames, ds.fps) == (3, 19, FPS)
    assert ds.tasks == tasks
    assert ds.camera_keys == ["observation.images.top"]
    np.testing.assert_allclose(ds.stats["action"]["mean"], truth["actions"].mean(0), rtol=1e-6)
    for e in range(3):
        start, stop = truth["starts"][e], truth["starts"][e + 1]
        ep = ds.episode(e)
        assert ep["task"] == tasks[truth["tasks"][e]]
        np.testing.assert_array_equal(ep["observation.state"], truth["states"][start:stop])
        np.testing.assert_array_equal(ep["action"], truth["actions"][start:stop])
        video = ep["observation.images.top"]
        assert video.shape == (stop - start, 32, 32, 3) and video.dtype == np.uint8
        assert np.abs(video.astype(float) - truth["images"][start:stop]).mean() < VIDEO_MAE
    frame = ds.frame(7)  # episode 1, frame 1
    assert frame["episode_index"] == 1 and frame["frame_index"] == 1 and frame["task"] == tasks[1]
    assert np.abs(frame["observation.images.top"].astype(float) - truth["images"][7]).mean() < VIDEO_MAE


# ---- our writer -> our reader -----------------------------------------------------------------------------
FEATURES = {
    "observation.state": {"dtype": "float32", "shape": [4], "names": None},
    "action": {"dtype": "float32", "shape": [3], "names": ["dx", "dy", "grip"]},
    "observation.images.main": {"dtype": "video", "shape": [32, 32, 3]},
}


def _episode(length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "observation.state": rng.normal(size=(length, 4)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(length, 3)).astype(np.float32),
        "observation.images.main": _frames(length, seed),
    }


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, list[dict], list[str]]:
    root = tmp_path_factory.mktemp("written") / "ds"
    episodes, tasks = [_episode(n, seed) for seed, n in enumerate([7, 12, 5])], ["reach", "push", "reach"]
    with LeRobotDatasetWriter(root, FPS, FEATURES, robot_type="test_arm") as writer:
        writer.add_episode(episodes[0], tasks[0])
        for t in range(12):  # the frame-by-frame path
            writer.add_frame({k: v[t] for k, v in episodes[1].items()})
        writer.save_episode(tasks[1])
        writer.add_episode(episodes[2], tasks[2])
    return root, episodes, tasks


def test_writer_reader_round_trip(written):
    root, episodes, tasks = written
    ds = LeRobotDataset(root)
    assert (ds.num_episodes, ds.num_frames) == (3, 24)
    assert ds.tasks == ["reach", "push"]
    for e, truth in enumerate(episodes):
        ep = ds.episode(e)
        assert ep["task"] == tasks[e]
        np.testing.assert_array_equal(ep["action"], truth["action"])
        np.testing.assert_array_equal(ep["observation.state"], truth["observation.state"])
        np.testing.assert_array_equal(ep["frame_index"], np.arange(len(truth["action"])))
        np.testing.assert_allclose(ep["timestamp"], np.arange(len(truth["action"])) / FPS, atol=1e-6)
        video = ep["observation.images.main"]
        assert video.shape == truth["observation.images.main"].shape
        assert np.abs(video.astype(float) - truth["observation.images.main"]).mean() < VIDEO_MAE


def test_written_layout_matches_the_spec(written):
    root = written[0]
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["robot_type"] == "test_arm"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"], info["fps"]) == (3, 24, 2, FPS)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["splits"] == {"train": "0:3"}
    assert info["features"]["observation.images.main"]["info"]["video.pix_fmt"] == "yuv420p"
    assert {"timestamp", "frame_index", "episode_index", "index", "task_index"} <= set(info["features"])
    # finalize concatenated the per-episode parts into one data file and one video per camera
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*.parquet")) == [
        "data/chunk-000/file-000.parquet",
        "meta/episodes/chunk-000/file-000.parquet",
        "meta/tasks.parquet",
    ]
    assert [p.name for p in root.rglob("*.mp4")] == ["file-000.mp4"]
    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    assert data.column("index").to_pylist() == list(range(24))
    assert data.schema.field("action").type == pa.list_(pa.float32(), 3)
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [e["dataset_from_index"] for e in episodes] == [0, 7, 19]
    assert [e["videos/observation.images.main/from_timestamp"] for e in episodes] == [0.0, 0.7, 1.9]
    assert episodes[1]["tasks"] == ["push"] and len(episodes[1]["stats/action/q01"]) == 3
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks.column("task").to_pylist() == ["reach", "push"]
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["task"]


def test_stats_match_the_data(written):
    root, episodes, _ = written
    stats = LeRobotDataset(root).stats
    actions = np.concatenate([e["action"] for e in episodes])
    np.testing.assert_allclose(stats["action"]["mean"], actions.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats["action"]["std"], actions.std(0), rtol=1e-5)
    np.testing.assert_allclose(stats["action"]["q01"], np.quantile(actions, 0.01, axis=0), rtol=1e-5)
    np.testing.assert_allclose(stats["action"]["q99"], np.quantile(actions, 0.99, axis=0), rtol=1e-5)
    assert stats["action"]["count"].tolist() == [24]
    image = stats["observation.images.main"]
    assert image["mean"].shape == (3, 1, 1) and image["count"].tolist() == [24]
    pixels = np.concatenate([e["observation.images.main"] for e in episodes]) / 255.0
    np.testing.assert_allclose(image["mean"].flatten(), pixels.mean((0, 1, 2)), rtol=1e-6)


# ---- training samples ----------------------------------------------------------------------------------
def test_action_chunks_pad_past_the_episode_end(written):
    root, episodes, tasks = written
    data = ActionChunkDataset(LeRobotDataset(root), chunk_size=4, obs_keys=("state", "rgb"), action_dim=3)
    assert len(data) == 24
    mid = data[2]  # episode 0, frame 2: actions 2..5 all inside the episode
    np.testing.assert_array_equal(mid["action"].numpy(), episodes[0]["action"][2:6])
    assert not mid["action_is_pad"].any()
    last = data[5]  # episode 0 has 7 frames: frames 5, 6 real, then 2 padded with the last action
    assert last["action_is_pad"].tolist() == [False, False, True, True]
    np.testing.assert_array_equal(last["action"].numpy(), episodes[0]["action"][[5, 6, 6, 6]])
    assert last["rgb"].dtype == torch.uint8 and last["rgb"].shape == (32, 32, 3)
    np.testing.assert_array_equal(data[8]["state"].numpy(), episodes[1]["observation.state"][1])
    assert data[8]["instruction"] == "push" and data[23]["instruction"] == tasks[2]
    batch = collate_chunks([data[i] for i in (0, 6, 20)])
    assert batch.batch_size == torch.Size([3]) and batch["action"].shape == (3, 4, 3)
    assert list(batch["instruction"]) == ["reach", "reach", "reach"]


def test_task_ids_follow_the_env_instruction_table(written):
    data = ActionChunkDataset(LeRobotDataset(written[0]), 2, instruction_table=["push", "press", "reach"])
    assert [int(data[i]["task_id"]) for i in (0, 7, 19)] == [2, 0, 2]
    with pytest.raises(UserError, match="not instructions of this env"):
        ActionChunkDataset(LeRobotDataset(written[0]), 2, instruction_table=["press"])
    # one task of a multi-task dataset: only the episodes read must be the env's
    pushes = ActionChunkDataset(LeRobotDataset(written[0]), 2, instruction_table=["push"], episodes=[1])
    assert int(pushes[7]["task_id"]) == 0
    with pytest.raises(UserError, match=r"\['reach'\] are not instructions"):
        ActionChunkDataset(LeRobotDataset(written[0]), 2, instruction_table=["push"], episodes=[1, 2])


# ---- bad input ----------------------------------------------------------------------------------------
def test_bad_input_raises_user_errors(written, tmp_path):
    ds = LeRobotDataset(written[0])
    with pytest.raises(UserError, match="policy expects 7"):
        ActionChunkDataset(ds, 4, action_dim=7)
    with pytest.raises(UserError, match="lacks features"):
        ActionChunkDataset(ds, 4, obs_keys=("state", "wrist_rgb"))
    with pytest.raises(UserError, match="not a LeRobot dataset"):
        LeRobotDataset(tmp_path)
    with pytest.raises(UserError, match="not empty"):
        LeRobotDatasetWriter(written[0], FPS, FEATURES)
    writer = LeRobotDatasetWriter(tmp_path / "new", FPS, FEATURES)
    frame = {k: v[0] for k, v in _episode(1, 0).items()}
    with pytest.raises(UserError, match="missing"):
        writer.add_frame({k: v for k, v in frame.items() if k != "action"})
    with pytest.raises(UserError, match=r"'action' has shape \[4\]"):
        writer.add_frame(frame | {"action": np.zeros(4, np.float32)})
    with pytest.raises(UserError, match="same number"):
        writer.add_episode(_episode(3, 0) | {"action": np.zeros((2, 3), np.float32)}, "reach")
    with pytest.raises(UserError, match="even H and W"):
        LeRobotDatasetWriter(tmp_path / "odd", FPS, {"cam": {"dtype": "video", "shape": [31, 32, 3]}})


def test_interrupted_writer_leaves_saved_episodes_readable(tmp_path):
    root = tmp_path / "ds"
    writer = LeRobotDatasetWriter(root, FPS, FEATURES)
    episodes = [_episode(6, 1), _episode(9, 2)]
    for e in episodes:
        writer.add_episode(e, "stack")

    def crash() -> None:
        raise KeyboardInterrupt

    writer._write_meta = crash  # dies after writing an episode's files, before listing it in meta/
    with pytest.raises(KeyboardInterrupt):
        writer.add_episode(_episode(4, 3), "stack")
    assert (root / "data/chunk-000/file-002.parquet").is_file()  # the orphan the reader must skip
    writer.add_frame({k: v[0] for k, v in _episode(3, 3).items()})  # a half-recorded episode
    del writer  # never finalized
    ds = LeRobotDataset(root)
    assert (ds.num_episodes, ds.num_frames) == (2, 15)
    for e, truth in enumerate(episodes):
        np.testing.assert_array_equal(ds.episode(e)["action"], truth["action"])
        video = ds.episode(e)["observation.images.main"]
        assert np.abs(video.astype(float) - truth["observation.images.main"]).mean() < VIDEO_MAE
    assert json.loads((root / "meta/info.json").read_text())["total_episodes"] == 2


def test_finalize_starts_new_files_past_the_size_limits(tmp_path, monkeypatch):
    monkeypatch.setattr(lerobot_format, "DATA_FILE_SIZE_MB", 1e-4)  # about one episode per file
    monkeypatch.setattr(lerobot_format, "VIDEO_FILE_SIZE_MB", 1e-4)
    episodes = [_episode(n, seed) for seed, n in enumerate([5, 8, 6])]
    with LeRobotDatasetWriter(tmp_path / "ds", FPS, FEATURES) as writer:
        for e in episodes:
            writer.add_episode(e, "reach")
    assert len(list((tmp_path / "ds/data").rglob("*.parquet"))) == 3
    assert len(list((tmp_path / "ds/videos").rglob("*.mp4"))) == 3
    ds = LeRobotDataset(tmp_path / "ds")
    for e, truth in enumerate(episodes):
        np.testing.assert_array_equal(ds.episode(e)["action"], truth["action"])
        video = ds.episode(e)["observation.images.main"]
        assert np.abs(video.astype(float) - truth["observation.images.main"]).mean() < VIDEO_MAE


# ---- a kill during finalize ---------------------------------------------------------------------------
def _unfinalized(root: Path) -> LeRobotDatasetWriter:
    writer = LeRobotDatasetWriter(root, FPS, FEATURES)
    for seed, (n, task) in enumerate([(7, "reach"), (12, "push"), (5, "reach")]):
        writer.add_episode(_episode(n, seed), task)
    return writer


def test_a_kill_at_any_rename_of_finalize_leaves_a_dataset_that_reads_whole(tmp_path, monkeypatch):
    """`collect` killed during its final folder swap left no data folder, or a table naming files that
    were gone (3 of 3 tries), and the reader raised a bare FileNotFoundError."""
    import os

    expected = LeRobotDataset(_unfinalized(tmp_path / "clean").root)  # per-episode files
    real_replace, calls = os.replace, []

    def counting(src, dst):
        calls.append(1)
        return real_replace(src, dst)

    counted = _unfinalized(tmp_path / "count")
    monkeypatch.setattr(os, "replace", counting)
    counted.finalize()
    monkeypatch.setattr(os, "replace", real_replace)
    renames = len(calls)
    assert renames >= 6  # staging files, then the three swaps
    for kill_at in range(renames):
        root = tmp_path / f"kill{kill_at}"
        writer = _unfinalized(root)
        calls.clear()

        def killed(src, dst, kill_at=kill_at):
            if len(calls) == kill_at:
                raise KeyboardInterrupt  # kill -9 stands here: nothing after this line runs
            calls.append(1)
            return real_replace(src, dst)

        monkeypatch.setattr(os, "replace", killed)
        with pytest.raises(KeyboardInterrupt):
            writer.finalize()
        monkeypatch.setattr(os, "replace", real_replace)
        ds = LeRobotDataset(root)
        assert not (root / ".finalize").exists()
        assert ds.num_episodes == 3 and ds.num_frames == expected.num_frames
        for e in range(3):
            np.testing.assert_array_equal(
                ds.camera_frames("observation.images.main", e),
                expected.camera_frames("observation.images.main", e),
            )
        np.testing.assert_array_equal(ds.column("action"), expected.column("action"))


def test_a_missing_dataset_folder_is_named():
    with pytest.raises(UserError, match="dataset /nonexistent/ds not found: no folder /nonexistent/ds;"):
        LeRobotDataset("/nonexistent/ds")


def test_a_repo_id_is_found_in_lerobots_cache_and_a_missing_one_says_where_it_looked(
    written, tmp_path, monkeypatch
):
    import shutil

    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    shutil.copytree(written[0], tmp_path / "home" / "someone" / "reach_demos")
    assert LeRobotDataset("someone/reach_demos").num_episodes == LeRobotDataset(written[0]).num_episodes
    with pytest.raises(UserError, match=r"someone/other not found: no folder .* nor .*home/someone/other"):
        LeRobotDataset("someone/other")


def test_video_times_keep_their_precision_past_2048_seconds_into_a_file():
    # float32 frame timestamps plus a Python float stay float32 (spacing 2.4e-4 s past 2048 s), which
    # the decoder's 1e-4 s tolerance rejected: a 1,200-episode collection could not be read back
    timestamps = np.arange(22, dtype=np.float32) * np.float32(0.05)
    naive = 2048.6 + timestamps
    exact = 2048.6 + np.arange(22) * 0.05
    assert naive.dtype == np.float32 and np.abs(naive - exact).max() > 1e-4
    times = video_times(2048.6, timestamps)
    assert times.dtype == np.float64 and np.abs(times - exact).max() < 1e-6
