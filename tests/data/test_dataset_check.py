"""`embodrl check-dataset`: a whole dataset is valid; what a kill or a damaged file leaves is named and,
where it can be, repaired."""

from __future__ import annotations

import pytest

from embodrl.cli import main
from embodrl.data.dataset_check import check_dataset
from embodrl.data.lerobot_dataset import LeRobotDataset, LeRobotDatasetWriter
from tests.data.test_lerobot_dataset import FEATURES, FPS, _episode


def _write(root, episodes: int = 3, finalize: bool = True) -> LeRobotDatasetWriter:
    writer = LeRobotDatasetWriter(root, FPS, FEATURES)
    for seed in range(episodes):
        writer.add_episode(_episode(5 + seed, seed), "reach")
    if finalize:
        writer.finalize()
    return writer


def test_a_whole_dataset_is_valid(tmp_path, capsys):
    _write(tmp_path / "ds")
    report = check_dataset(tmp_path / "ds")
    assert report.ok and report.episodes == 3 and report.frames == 5 + 6 + 7
    assert main(["check-dataset", str(tmp_path / "ds")]) == 0
    assert "valid (3 episodes, 18 frames)" in capsys.readouterr().out


def test_an_episode_cut_short_by_a_kill_and_tmp_files_are_named_then_repaired(tmp_path, monkeypatch):
    root = tmp_path / "ds"
    writer = _write(root, 2, finalize=False)
    monkeypatch.setattr(writer, "_write_meta", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):  # the episode's files are written, the table never lists it
        writer.add_episode(_episode(9, 7), "reach")
    (root / "data" / "stray.parquet.tmp").write_bytes(b"half")
    report = check_dataset(root)
    assert not report.ok and report.episodes == 2
    assert any("not listed" in p for p in report.problems) and any(".tmp" in p for p in report.problems)
    with pytest.raises(SystemExit):
        main(["check-dataset", str(root)])
    repaired = check_dataset(root, repair=True)
    assert repaired.ok and len(repaired.repaired) == 2
    assert check_dataset(root).ok and LeRobotDataset(root).num_episodes == 2


def test_info_left_behind_the_table_by_a_kill_is_named_then_rewritten(tmp_path, monkeypatch):
    import embodrl.data.lerobot_writer as writer_module

    root = tmp_path / "ds"
    writer = _write(root, 2, finalize=False)
    real_write_json = writer_module.fmt.write_json_atomic

    def killed_before_info(path, payload):
        if path.name == "info.json":
            raise KeyboardInterrupt()
        real_write_json(path, payload)

    monkeypatch.setattr(writer_module.fmt, "write_json_atomic", killed_before_info)
    with pytest.raises(KeyboardInterrupt):  # the table lists the third episode, info.json does not
        writer.add_episode(_episode(9, 7), "reach")
    monkeypatch.undo()
    report = check_dataset(root)
    assert any("info.json says 2 episodes, the table 3" in p for p in report.problems)
    repaired = check_dataset(root, repair=True)
    assert repaired.ok and repaired.repaired == ["rewrote info.json and stats.json from the episodes table"]
    ds = LeRobotDataset(root)
    assert (ds.info["total_episodes"], ds.info["total_frames"]) == (3, 5 + 6 + 9)


def test_a_damaged_video_is_named(tmp_path):
    root = tmp_path / "ds"
    _write(root)
    (video,) = (root / "videos").rglob("*.mp4")
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 3])
    report = check_dataset(root)
    assert not report.ok and "does not decode" in report.problems[0]
    assert check_dataset(root, quick=True).ok  # --quick does not decode


def test_a_dataset_stopped_before_its_first_episode_is_valid_and_empty(tmp_path):
    LeRobotDatasetWriter(tmp_path / "ds", FPS, FEATURES)  # killed before any episode: meta only
    report = check_dataset(tmp_path / "ds")
    assert report.ok and report.episodes == 0
