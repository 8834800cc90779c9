"""Write demonstrations as a LeRobotDataset v3.0 folder, crash-safe episode by episode.

Each saved episode goes to its own data parquet and mp4 files (a valid v3 layout: the episodes table
says which file holds which episode), and meta/ is rewritten atomically after it, so a collect that
dies leaves every saved episode readable. `finalize()` then concatenates the episodes into LeRobot's
usual few large files (data/chunk-000/file-000.parquet, videos/<key>/chunk-000/file-000.mp4).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embodrl.data import lerobot_format as fmt
from embodrl.data.video import VideoConfig, concat_videos, encode_video
from embodrl.errors import UserError

# Columns of meta/episodes that LeRobot defines (besides the data/, videos/, meta/ and stats/ groups).
EPISODE_COLUMNS = ("episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index")


# finalize() builds the consolidated files here, marks them complete, then swaps them in
FINALIZE_DIR = ".finalize"
FINALIZE_READY = "READY"
SWAPPED = ("data", "videos", "meta/episodes")  # what finalize replaces: the files and the table naming them


def complete_finalize(root: Path) -> bool:
    """Finish, or undo, a finalize() of the dataset at `root` that a kill interrupted; True if one was found.

    With the READY mark every consolidated folder is complete, so the swap is carried through (a folder
    already swapped is skipped, so a kill during this call is recovered by the next); without it the
    per-episode files are still in place and the half-built staging folder is removed.
    """
    staging = root / FINALIZE_DIR
    if not staging.exists():
        return False
    if (staging / FINALIZE_READY).is_file():
        for name in SWAPPED:
            new, current = staging / name, root / name
            old = root / f".old-{name.replace('/', '-')}"
            if not new.exists():
                continue  # swapped before the kill, or a dataset without videos
            if current.exists():
                shutil.rmtree(old, ignore_errors=True)
                os.replace(current, old)
            os.replace(new, current)
        for name in SWAPPED:
            shutil.rmtree(root / f".old-{name.replace('/', '-')}", ignore_errors=True)
    shutil.rmtree(staging)
    return True


def read_episode_rows(root: Path) -> list[dict]:
    """The episodes table of the dataset at `root` (meta/episodes only, no data), one dict per episode; an
    interrupted finalize is completed first, as every reader does."""
    complete_finalize(root)
    rows = []
    for path in sorted((root / "meta" / "episodes").glob("*/*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return sorted(rows, key=lambda row: row["episode_index"])


def is_consolidated(rows: list[dict]) -> bool:
    """Whether episodes-table `rows` describe finalized files (several episodes per file), not the one file
    per episode that an unfinished writer leaves."""
    return any(row["data/file_index"] != row["episode_index"] for row in rows)


class LeRobotDatasetWriter:
    """Builds a LeRobotDataset v3.0 folder at `root` from frames or whole episodes.

    `features` follows LeRobot: {"action": {"dtype": "float32", "shape": [7], "names": [...]},
    "observation.images.main": {"dtype": "video", "shape": [H, W, 3]}, ...}; timestamp, frame_index,
    episode_index, index and task_index are added by the writer.
    """

    def __init__(
        self,
        root: str | Path,
        fps: int,
        features: dict[str, dict],
        robot_type: str | None = None,
        video: VideoConfig | None = None,
    ):
        self.root = Path(root)
        if self.root.exists() and any(self.root.iterdir()):
            raise UserError(
                f"dataset folder {self.root} already exists and is not empty; choose a new folder"
            )
        if fps <= 0:
            raise UserError(f"fps must be > 0, got {fps}")
        self.fps = int(fps)
        self.robot_type = robot_type
        self.video = video or VideoConfig()
        self.features = fmt.validate_features(features)
        self.video_keys = [k for k, ft in self.features.items() if ft["dtype"] == "video"]
        self.tasks: list[str] = []
        self.num_frames = 0
        self._buffer: dict[str, list[np.ndarray]] = {k: [] for k in self.features}
        self._episode_rows: list[pa.Table] = []
        self._values: dict[str, list[np.ndarray]] = {k: [] for k in self._numeric_features()}
        self._video_stats: dict[str, list[dict[str, np.ndarray]]] = {k: [] for k in self.video_keys}
        self._finalized = False
        self._write_meta()

    @classmethod
    def reopen(cls, root: str | Path, video: VideoConfig | None = None) -> LeRobotDatasetWriter:
        """A writer that appends to the unfinished dataset at `root` (its episodes saved one file each, as an
        interrupted writer leaves them); a finalized dataset is refused."""
        root = Path(root)
        rows = read_episode_rows(root)
        info_path = root / fmt.INFO_PATH
        if not info_path.is_file():
            raise UserError(f"{root} is not a dataset this writer started ({fmt.INFO_PATH} is missing)")
        info = json.loads(info_path.read_text())
        writer = cls.__new__(cls)
        writer.root, writer.fps, writer.robot_type = root, int(info["fps"]), info.get("robot_type")
        writer.video = video or VideoConfig()
        defaults = set(fmt.DEFAULT_FEATURES)
        writer.features = {k: ft for k, ft in info["features"].items() if k not in defaults}
        writer.video_keys = [k for k, ft in writer.features.items() if ft["dtype"] == "video"]
        tasks_path = root / fmt.TASKS_PATH
        writer.tasks = fmt.read_tasks(tasks_path) if tasks_path.is_file() else []
        writer._buffer = {k: [] for k in writer.features}
        writer._finalized = False
        if is_consolidated(rows):
            raise UserError(f"{root} is a finished dataset (its episodes are consolidated); write a new one")
        writer._episode_rows = [pa.Table.from_pylist([row]) for row in rows]
        writer.num_frames = sum(row["length"] for row in rows)
        numeric = writer._numeric_features()
        writer._values = {k: [] for k in numeric}
        for row in rows:
            loc = {"chunk_index": row["data/chunk_index"], "file_index": row["data/file_index"]}
            table = pq.read_table(root / fmt.DATA_PATH.format(**loc))
            for key, ft in numeric.items():
                writer._values[key].append(fmt.column_to_numpy(table.column(key), ft["shape"]))
        writer._video_stats = {
            key: [
                {
                    name.split("/")[-1]: np.asarray(v)
                    for name, v in row.items()
                    if name.startswith(f"stats/{key}/")
                }
                for row in rows
            ]
            for key in writer.video_keys
        }
        return writer

    @property
    def num_episodes(self) -> int:
        return len(self._episode_rows)

    def _numeric_features(self) -> dict[str, dict]:
        user = {k: ft for k, ft in self.features.items() if ft["dtype"] != "video"}
        return {**user, **fmt.DEFAULT_FEATURES}

    # ---- input ---------------------------------------------------------------------------------------
    def _check_keys(self, keys) -> None:
        missing, extra = set(self.features) - set(keys), set(keys) - set(self.features)
        if missing or extra:
            raise UserError(
                f"frame features do not match the dataset's: missing {sorted(missing)}, "
                f"unexpected {sorted(extra)}; the dataset declares {sorted(self.features)}"
            )

    def _as_array(self, key: str, value, leading: tuple[int, ...]) -> np.ndarray:
        ft = self.features[key]
        value = np.asarray(value)
        shape = tuple(ft["shape"])
        if ft["dtype"] != "video" and shape == (1,) and value.shape == leading:
            value = value.reshape(*leading, 1)
        if value.shape[len(leading) :] != shape:
            raise UserError(
                f"feature {key!r} has shape {list(value.shape[len(leading) :])} per frame; "
                f"the dataset declares {list(shape)}"
            )
        if ft["dtype"] == "video" and value.dtype != np.uint8:
            raise UserError(f"video feature {key!r} needs uint8 frames [H, W, 3], got dtype {value.dtype}")
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            raise UserError(f"feature {key!r} contains NaN or inf")
        return value.astype(np.uint8 if ft["dtype"] == "video" else np.dtype(ft["dtype"]), copy=False)

    def add_frame(self, frame: dict) -> None:
        """Buffer one frame {feature: value}; `save_episode` writes the buffered frames as an episode."""
        self._check_open()
        self._check_keys(frame)
        for key, value in frame.items():
            self._buffer[key].append(self._as_array(key, value, ()))

    def save_episode(self, task: str) -> int:
        """Write the buffered frames as one episode with instruction `task`; returns its index."""
        if not self._buffer[next(iter(self.features))]:
            raise UserError("save_episode called with no frames; call add_frame first")
        data = {k: np.stack(v) for k, v in self._buffer.items()}
        self._buffer = {k: [] for k in self.features}
        return self.add_episode(data, task)

    def add_episode(self, data: dict, task: str, info: dict[str, int | float | str] | None = None) -> int:
        """Write a whole episode {feature: values [T, *shape]} with instruction `task`; returns its index.

        `info`: extra per-episode columns of meta/episodes (e.g. the simulator's initial state id),
        which LeRobot readers ignore and `LeRobotDataset.episodes` returns."""
        self._check_open()
        self._check_keys(data)
        if not isinstance(task, str) or not task:
            raise UserError(f"an episode needs a non-empty task string, got {task!r}")
        info = dict(info or {})
        allowed = (int, float, str)
        bad = [k for k, v in info.items() if "/" in k or k in EPISODE_COLUMNS or not isinstance(v, allowed)]
        if bad:
            raise UserError(
                f"episode info keys {bad} clash with LeRobot's episode columns or hold a value that is not "
                "an int, float or str"
            )
        lengths = {k: (np.shape(v) or (0,))[0] for k, v in data.items()}
        length = next(iter(lengths.values()))
        if length == 0 or any(n != length for n in lengths.values()):
            raise UserError(
                f"every feature of an episode needs the same number (> 0) of frames, got {lengths}"
            )
        data = {k: self._as_array(k, v, (length,)) for k, v in data.items()}
        return self._write_episode(data, task, length, info)

    def _check_open(self) -> None:
        if self._finalized:
            raise UserError(f"the dataset at {self.root} is finalized; open a new writer to add episodes")

    # ---- output --------------------------------------------------------------------------------------
    def _write_episode(self, data: dict[str, np.ndarray], task: str, length: int, info: dict) -> int:
        episode = self.num_episodes
        if task not in self.tasks:
            self.tasks.append(task)
            fmt.write_parquet_atomic(self.root / fmt.TASKS_PATH, fmt.tasks_table(self.tasks))
        videos = {k: data.pop(k) for k in self.video_keys}  # [T, H, W, 3] uint8 each
        data["timestamp"] = (np.arange(length) / self.fps).astype(np.float32)
        data["frame_index"] = np.arange(length, dtype=np.int64)
        data["episode_index"] = np.full(length, episode, dtype=np.int64)
        data["index"] = self.num_frames + np.arange(length, dtype=np.int64)
        data["task_index"] = np.full(length, self.tasks.index(task), dtype=np.int64)
        numeric = self._numeric_features()
        loc = fmt.chunk_file(episode)  # one file per episode until finalize()
        row: dict = {
            "episode_index": episode,
            "tasks": [task],
            "length": length,
            "data/chunk_index": loc["chunk_index"],
            "data/file_index": loc["file_index"],
            "dataset_from_index": self.num_frames,
            "dataset_to_index": self.num_frames + length,
            **info,
        }
        stats = {k: fmt.feature_stats(data[k].reshape(length, *ft["shape"])) for k, ft in numeric.items()}
        for key, frames in videos.items():
            path = self.root / fmt.VIDEO_PATH.format(video_key=key, **loc)
            tmp = path.with_name(path.name + ".tmp")
            self.features[key]["info"] = encode_video(tmp, frames, self.fps, self.video)
            os.replace(tmp, path)
            row |= {
                f"videos/{key}/chunk_index": loc["chunk_index"],
                f"videos/{key}/file_index": loc["file_index"],
                f"videos/{key}/from_timestamp": 0.0,
                f"videos/{key}/to_timestamp": length / self.fps,
            }
            stats[key] = fmt.image_stats(frames)
            self._video_stats[key].append(stats[key])
        # Videos first, then the data file, then meta: readers glob data/*/*.parquet, so the data file
        # must appear last and only a crash in the instant before the meta update leaves an orphan.
        table = pa.table({k: fmt.to_arrow(data[k], ft) for k, ft in numeric.items()})
        fmt.write_parquet_atomic(self.root / fmt.DATA_PATH.format(**loc), table)
        row |= {"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0}
        row |= {f"stats/{k}/{s}": v.tolist() for k, st in stats.items() for s, v in st.items()}
        self._episode_rows.append(pa.Table.from_pylist([row]))
        for key in self._values:
            self._values[key].append(data[key])
        self.num_frames += length
        self._write_meta()
        return episode

    def _stats(self) -> dict[str, dict[str, np.ndarray]]:
        """Dataset stats: exact over all frames for numeric features, aggregated per episode for videos."""
        # flattened first: a shape-[1] feature is [T] when reopened from parquet and [T, 1] when just added
        stats = {
            k: fmt.feature_stats(
                np.concatenate([x.reshape(-1) for x in v]).reshape(
                    self.num_frames, *self._numeric_features()[k]["shape"]
                )
            )
            for k, v in self._values.items()
            if v
        }
        stats |= {k: fmt.aggregate_stats(v) for k, v in self._video_stats.items() if v}
        return stats

    def _info(self) -> dict:
        features = {**self.features, **fmt.DEFAULT_FEATURES}
        return {
            "codebase_version": fmt.CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": self.num_episodes,
            "total_frames": self.num_frames,
            "total_tasks": len(self.tasks),
            "chunks_size": fmt.CHUNKS_SIZE,
            "data_files_size_in_mb": fmt.DATA_FILE_SIZE_MB,
            "video_files_size_in_mb": fmt.VIDEO_FILE_SIZE_MB,
            "fps": self.fps,
            "splits": {"train": f"0:{self.num_episodes}"},
            "data_path": fmt.DATA_PATH,
            "video_path": fmt.VIDEO_PATH if self.video_keys else None,
            "features": features,
        }

    def _write_meta(self) -> None:
        """Episodes table, then stats, then info: each file is replaced atomically (a kill between them
        leaves stats and info one episode behind the table; `rewrite_meta` brings them level)."""
        if self._episode_rows:
            episodes = pa.concat_tables(self._episode_rows, promote_options="default")
            fmt.write_parquet_atomic(self.root / fmt.EPISODES_PATH.format(**fmt.chunk_file(0)), episodes)
            fmt.write_json_atomic(self.root / fmt.STATS_PATH, fmt.stats_to_json(self._stats()))
        fmt.write_json_atomic(self.root / fmt.INFO_PATH, self._info())

    def rewrite_meta(self) -> None:
        """Rewrite stats and info.json from the episodes table, e.g. after a kill between their writes."""
        self._check_open()
        self._write_meta()

    # ---- consolidation -------------------------------------------------------------------------------
    def finalize(self) -> None:
        """Concatenate the per-episode files into LeRobot's large files (a new file past the size limits).

        The consolidated files are built in a staging folder and swapped in with renames, so the folder
        stays readable up to the swap itself.
        """
        if self._finalized:
            return
        self._finalized = True
        if self.num_episodes == 0:
            return
        staging = self.root / FINALIZE_DIR
        shutil.rmtree(staging, ignore_errors=True)
        episodes = pa.concat_tables(self._episode_rows, promote_options="default").to_pylist()
        self._consolidate_data(episodes, staging)
        for key in self.video_keys:
            self._consolidate_video(key, episodes, staging)
        self._episode_rows = [pa.Table.from_pylist([row]) for row in episodes]
        table = pa.concat_tables(self._episode_rows, promote_options="default")
        fmt.write_parquet_atomic(staging / fmt.EPISODES_PATH.format(**fmt.chunk_file(0)), table)
        (staging / FINALIZE_READY).touch()  # from here on the new files are complete: the swap is owed
        complete_finalize(self.root)

    def _consolidate_data(self, episodes: list[dict], staging: Path) -> None:
        number, size, pending = 0, 0.0, []

        def flush() -> None:
            path = staging / fmt.DATA_PATH.format(**fmt.chunk_file(number))
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.concat_tables(pending), path)

        for row in episodes:
            part = self.root / fmt.DATA_PATH.format(
                chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
            )
            table = pq.read_table(part)
            if pending and size + table.nbytes / 2**20 > fmt.DATA_FILE_SIZE_MB:
                flush()
                number, size, pending = number + 1, 0.0, []
            pending.append(table)
            size += table.nbytes / 2**20
            row["data/chunk_index"], row["data/file_index"] = fmt.chunk_file(number).values()
        flush()

    def _consolidate_video(self, key: str, episodes: list[dict], staging: Path) -> None:
        number, size, start, parts = 0, 0.0, 0.0, []

        def flush() -> None:
            concat_videos(parts, staging / fmt.VIDEO_PATH.format(video_key=key, **fmt.chunk_file(number)))

        for row in episodes:
            col = f"videos/{key}/"
            part = self.root / fmt.VIDEO_PATH.format(
                video_key=key, chunk_index=row[col + "chunk_index"], file_index=row[col + "file_index"]
            )
            part_mb = part.stat().st_size / 2**20
            if parts and size + part_mb > fmt.VIDEO_FILE_SIZE_MB:
                flush()
                number, size, start, parts = number + 1, 0.0, 0.0, []
            duration = row["length"] / self.fps
            parts.append((part, start))
            row[col + "chunk_index"], row[col + "file_index"] = fmt.chunk_file(number).values()
            row[col + "from_timestamp"], row[col + "to_timestamp"] = start, start + duration
            size += part_mb
            start += duration
        flush()

    def __enter__(self) -> LeRobotDatasetWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        # On an error the saved episodes stay as they are (readable); only a clean exit consolidates.
        if exc_type is None:
            self.finalize()
