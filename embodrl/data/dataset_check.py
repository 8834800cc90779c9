"""`embodrl check-dataset`: say what is wrong with a LeRobotDataset v3 folder, and repair what can be.

Checks that the folder reads, that info.json, the episodes table and the data agree (counts, contiguous
frame ranges, per-episode frame and episode indices, task ids), that stats cover every numeric feature,
and (unless quick) that every episode's video decodes. Repairs: an interrupted consolidation is carried
through or dropped (as any reader does), leftover `*.tmp` files are removed, and data or video files of
an episode that a kill left unlisted are removed, and info.json and stats.json that a kill left one
episode behind the episodes table are rewritten from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from embodrl.data import lerobot_format as fmt
from embodrl.data.lerobot_dataset import LeRobotDataset, locate_dataset
from embodrl.data.lerobot_writer import (
    LeRobotDatasetWriter,
    complete_finalize,
    is_consolidated,
    read_episode_rows,
)
from embodrl.errors import UserError


@dataclass
class DatasetReport:
    root: Path
    problems: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    episodes: int = 0
    frames: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        lines = [f"repaired: {r}" for r in self.repaired] + [f"problem: {p}" for p in self.problems]
        verdict = "valid" if self.ok else f"{len(self.problems)} problem(s)"
        head = f"{self.root}: {verdict} ({self.episodes} episodes, {self.frames} frames)"
        return "\n".join([head, *lines])


def unlisted_files(root: Path, listed_frames: int) -> list[Path]:
    """Per-episode data files (and their videos) whose frames all lie past the last listed episode: what a
    kill between an episode's files and the episodes table leaves."""
    out = []
    for path in sorted((root / "data").glob("*/*.parquet")):
        index = pq.read_table(path, columns=["index"]).column("index").to_numpy()
        if len(index) and index.min() >= listed_frames:
            out.append(path)
            chunk, file = path.parent.name, path.stem
            out += sorted((root / "videos").glob(f"*/{chunk}/{file}.mp4"))
    return out


def check_dataset(root: str | Path, repair: bool = False, quick: bool = False) -> DatasetReport:
    """What is wrong with the dataset at `root` (and, with `repair`, what was fixed)."""
    report = DatasetReport(Path(root))
    try:
        root = report.root = locate_dataset(root)  # a folder, or a repo id in LeRobot's cache
    except UserError as error:
        report.problems.append(str(error))
        return report
    if complete_finalize(root):  # a committed journal: every reader carries it through
        report.repaired.append("finished (or dropped) the consolidation an interrupted run left")
    leftovers = sorted(p for p in root.rglob("*.tmp") if p.is_file())
    _remove_or_report(report, root, leftovers, repair, "unfinished *.tmp file(s)")
    try:
        ds = LeRobotDataset(root)
    except UserError as error:
        report.problems.append(str(error))
        return report
    except Exception as error:  # noqa: BLE001 - a damaged file of any kind is a finding
        report.problems.append(f"does not read: {type(error).__name__}: {error}")
        return report
    report.episodes, report.frames = ds.num_episodes, ds.num_frames
    orphans = unlisted_files(root, ds.num_frames)
    _remove_or_report(
        report, root, orphans, repair, "file(s) of an episode cut short, not listed (ignored on read)"
    )
    info = ds.info
    behind = (info.get("total_episodes"), info.get("total_frames")) != (ds.num_episodes, ds.num_frames)
    if behind and repair and not is_consolidated(read_episode_rows(root)):
        # a kill between the episodes table and info.json: the table and its data files are the truth
        LeRobotDatasetWriter.reopen(root).rewrite_meta()
        report.repaired.append("rewrote info.json and stats.json from the episodes table")
        ds = LeRobotDataset(root)
        info = ds.info
    if info.get("total_episodes") != ds.num_episodes:
        report.problems.append(
            f"info.json says {info.get('total_episodes')} episodes, the table {ds.num_episodes}"
        )
    if info.get("total_frames") != ds.num_frames:
        report.problems.append(f"info.json says {info.get('total_frames')} frames, the data {ds.num_frames}")
    _check_episodes(ds, report)
    missing = [k for k, ft in ds.features.items() if ft["dtype"] in fmt.NUMERIC_DTYPES and k not in ds.stats]
    if missing and ds.num_episodes:
        report.problems.append(f"meta/stats.json lacks {missing}")
    if not quick:
        for key in ds.camera_keys:
            for episode in range(ds.num_episodes):
                try:
                    frames = ds.camera_frames(key, episode)
                except Exception as error:  # noqa: BLE001
                    report.problems.append(f"{key} of episode {episode} does not decode: {error}")
                    break
                start, stop = ds.episode_range(episode)
                if len(frames) != stop - start:
                    report.problems.append(
                        f"{key} of episode {episode}: {len(frames)} frames for {stop - start}"
                    )
                    break
    return report


def _remove_or_report(report: DatasetReport, root: Path, files: list[Path], repair: bool, what: str) -> None:
    """Remove `files` (repair) or name them as a problem."""
    if not files:
        return
    if repair:
        for path in files:
            path.unlink()
        report.repaired.append(f"removed {len(files)} {what}")
    else:
        report.problems.append(
            f"{len(files)} {what}, e.g. {files[0].relative_to(root)} (--repair removes them)"
        )


def _check_episodes(ds: LeRobotDataset, report: DatasetReport) -> None:
    """Contiguous frame ranges, lengths, and each frame's episode index, frame index and task."""
    if ds.num_episodes == 0:  # a writer that stopped before its first episode: valid, empty
        if ds.num_frames:
            report.problems.append(f"{ds.num_frames} frames but no episode lists them")
        return
    bounds = np.asarray([ds.episode_range(e) for e in range(ds.num_episodes)]).reshape(-1, 2)
    if len(bounds) and (bounds[0, 0] != 0 or np.any(bounds[1:, 0] != bounds[:-1, 1])):
        report.problems.append("episode frame ranges are not contiguous from 0")
        return
    lengths = ds.episodes.get("length")
    if lengths is not None and list(bounds[:, 1] - bounds[:, 0]) != list(lengths):
        report.problems.append("episode lengths differ from their frame ranges")
    episode_index = ds.column("episode_index").reshape(-1)
    frame_index = ds.column("frame_index").reshape(-1)
    expected_episode = np.repeat(np.arange(ds.num_episodes), bounds[:, 1] - bounds[:, 0])
    if not np.array_equal(episode_index, expected_episode):
        report.problems.append("frames carry episode indices that differ from the episodes table")
    expected_frame = np.concatenate([np.arange(e - s) for s, e in bounds]) if len(bounds) else frame_index
    if not np.array_equal(frame_index, expected_frame):
        report.problems.append("frame_index does not count 0.. within every episode")
    task_index = ds.column("task_index").reshape(-1)
    if len(task_index) and (task_index.min() < 0 or task_index.max() >= len(ds.tasks)):
        report.problems.append(f"task_index outside the {len(ds.tasks)} tasks of meta/tasks.parquet")
