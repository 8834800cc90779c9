"""Read LeRobotDataset v3.0 folders (ours or LeRobot's): frames, episodes, decoded video, stats."""

from __future__ import annotations

import io
import json
import logging
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from embodrl.data import lerobot_format as fmt
from embodrl.data.lerobot_writer import LeRobotDatasetWriter, complete_finalize
from embodrl.data.video import decode_frames
from embodrl.errors import UserError

__all__ = ["LeRobotDataset", "LeRobotDatasetWriter"]

log = logging.getLogger(__name__)


def lerobot_home() -> Path:
    """Where LeRobot keeps datasets by repo id: $HF_LEROBOT_HOME, else $HF_HOME/lerobot, else
    ~/.cache/huggingface/lerobot (LeRobot's own rule)."""
    if os.environ.get("HF_LEROBOT_HOME"):
        return Path(os.environ["HF_LEROBOT_HOME"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(hf_home).expanduser() / "lerobot"


def locate_dataset(name: str | Path) -> Path:
    """A dataset folder, or a repo id ("user/name") of one in LeRobot's local cache; nothing is downloaded."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    cached = lerobot_home() / str(name)
    looked = f"no folder {path}"
    if not path.is_absolute() and "/" in str(name):
        if cached.is_dir():
            return cached
        looked += f", nor {cached} (a repo id in LeRobot's cache, HF_LEROBOT_HOME)"
    raise UserError(f"dataset {name} not found: {looked}; nothing is downloaded at run time")


class LeRobotDataset:
    """A LeRobotDataset v3.0 folder held in memory (numeric columns) with videos decoded on demand.

    Decoded episodes are cached (`video_cache_episodes` of them per camera); frames come back as
    uint8 [H, W, 3], numeric features as arrays of their declared shape (scalars for shape [1]).
    """

    def __init__(self, root: str | Path, video_cache_episodes: int = 32, tolerance_s: float = 1e-4):
        self.root = locate_dataset(root)
        # A finalize that a kill interrupted is a committed journal: carry it through (or drop it) first.
        if complete_finalize(self.root):
            log.warning("%s: finished the consolidation that an interrupted collection left", self.root)
        info_path = self.root / fmt.INFO_PATH
        if not info_path.is_file():
            raise UserError(f"{self.root} is not a LeRobot dataset: {fmt.INFO_PATH} is missing")
        self.info = json.loads(info_path.read_text())
        version = str(self.info.get("codebase_version", "?"))
        if not version.startswith("v3"):
            raise UserError(
                f"{self.root} is a LeRobot {version} dataset; this reader needs v3.0 "
                "(convert it with LeRobot's convert_dataset_v21_to_v30 script)"
            )
        self.fps = int(self.info["fps"])
        self.features: dict[str, dict] = self.info["features"]
        self.camera_keys = [k for k, ft in self.features.items() if ft["dtype"] in fmt.VISUAL_DTYPES]
        self.tolerance_s = tolerance_s
        tasks_path = self.root / fmt.TASKS_PATH
        self.tasks: list[str] = fmt.read_tasks(tasks_path) if tasks_path.is_file() else []
        stats_path = self.root / fmt.STATS_PATH
        self.stats = fmt.stats_from_json(json.loads(stats_path.read_text())) if stats_path.is_file() else {}
        self.episodes = self._read_episodes()
        self._columns = self._read_data()
        self._from = np.asarray(self.episodes.get("dataset_from_index", []), dtype=np.int64)
        self._to = np.asarray(self.episodes.get("dataset_to_index", []), dtype=np.int64)
        self._cache: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._cache_size = video_cache_episodes

    # ---- loading ---------------------------------------------------------------------------------------
    def _read_episodes(self) -> dict[str, list]:
        files = sorted((self.root / "meta" / "episodes").glob("*/*.parquet"))
        if not files:
            return {}
        table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
        keep = [c for c in table.column_names if not c.startswith("stats/")]
        table = table.select(keep).sort_by("episode_index")
        return {c: table.column(c).to_pylist() for c in keep}

    def _read_data(self) -> dict[str, np.ndarray | list]:
        files = sorted((self.root / "data").glob("*/*.parquet"))
        if not files:
            return {}
        table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
        if "index" not in table.column_names:
            raise UserError(f"{self.root}: data files have no 'index' column; is this a LeRobot v3 dataset?")
        table = table.sort_by("index")
        if self.episodes:  # frames past the last listed episode: an episode cut short by a crash
            table = table.filter(pc.less(table.column("index"), max(self.episodes["dataset_to_index"])))
        index = table.column("index").to_numpy()
        if len(index) and (index[0] != 0 or index[-1] != len(index) - 1):
            raise UserError(
                f"{self.root}: frame indices are not 0..{len(index) - 1}; the data files are incomplete"
            )
        columns: dict[str, np.ndarray | list] = {}
        for key, ft in self.features.items():
            if ft["dtype"] == "video":
                continue
            if key not in table.column_names:
                raise UserError(f"{self.root}: info.json declares feature {key!r} but the data files lack it")
            if ft["dtype"] in fmt.NUMERIC_DTYPES:
                columns[key] = fmt.column_to_numpy(table.column(key), ft["shape"])
            else:  # image structs {bytes, path}, strings: decoded when accessed
                columns[key] = table.column(key).to_pylist()
        return columns

    # ---- sizes and lookups -----------------------------------------------------------------------------
    @property
    def num_episodes(self) -> int:
        return len(self._from)

    @property
    def num_frames(self) -> int:
        return len(self._columns["index"]) if "index" in self._columns else 0

    def __len__(self) -> int:
        return self.num_frames

    def episode_range(self, episode: int) -> tuple[int, int]:
        """Global frame indices [start, stop) of an episode."""
        if not 0 <= episode < self.num_episodes:
            raise UserError(f"episode {episode} out of range [0, {self.num_episodes})")
        return int(self._from[episode]), int(self._to[episode])

    def episode_of(self, index: np.ndarray | int) -> np.ndarray:
        """Episode number of global frame indices."""
        return np.searchsorted(self._from, index, side="right") - 1

    def column(self, key: str) -> np.ndarray:
        """All frames of a numeric feature [num_frames, *shape]."""
        if key not in self._columns or not isinstance(self._columns[key], np.ndarray):
            numeric = [k for k, v in self._columns.items() if isinstance(v, np.ndarray)]
            raise UserError(f"{self.root} has no numeric feature {key!r}; it has {numeric}")
        return self._columns[key]

    # ---- frames and episodes ---------------------------------------------------------------------------
    def camera_frames(self, key: str, episode: int) -> np.ndarray:
        """Every frame of one camera in one episode, uint8 [T, H, W, 3] (cached)."""
        if key not in self.camera_keys:
            raise UserError(f"{key!r} is not a camera of {self.root}; cameras: {self.camera_keys}")
        if (key, episode) in self._cache:
            self._cache.move_to_end((key, episode))
            return self._cache[(key, episode)]
        start, stop = self.episode_range(episode)
        if self.features[key]["dtype"] == "image":
            frames = np.stack([_decode_image(v) for v in self._columns[key][start:stop]])
        else:
            col = f"videos/{key}/"
            path = self.root / self.info["video_path"].format(
                video_key=key,
                chunk_index=self.episodes[col + "chunk_index"][episode],
                file_index=self.episodes[col + "file_index"][episode],
            )
            times = video_times(
                self.episodes[col + "from_timestamp"][episode], self._columns["timestamp"][start:stop]
            )
            frames = decode_frames(path, times, self.tolerance_s)
        self._cache[(key, episode)] = frames
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return frames

    def frame(self, index: int) -> dict:
        """One frame: every feature (images decoded, uint8 [H, W, 3]) and its `task` string."""
        if not 0 <= index < self.num_frames:
            raise UserError(f"frame {index} out of range [0, {self.num_frames})")
        episode = int(self.episode_of(index))
        start = self.episode_range(episode)[0]
        out = {k: v[index] for k, v in self._columns.items() if k not in self.camera_keys}
        for key in self.camera_keys:
            out[key] = self.camera_frames(key, episode)[index - start]
        out["task"] = self.tasks[int(self._columns["task_index"][index])]
        return out

    __getitem__ = frame

    def episode(self, episode: int) -> dict:
        """One episode: every feature over its frames [T, ...] (images uint8 [T, H, W, 3]) and `task`."""
        start, stop = self.episode_range(episode)
        out = {k: v[start:stop] for k, v in self._columns.items() if k not in self.camera_keys}
        for key in self.camera_keys:
            out[key] = self.camera_frames(key, episode)
        out["task"] = self.tasks[int(self._columns["task_index"][start])]
        return out


def video_times(from_timestamp: float, timestamps: np.ndarray) -> np.ndarray:
    """Where an episode's frames sit in its video file, in float64 seconds: the float32 frame timestamps
    added to a Python float stay float32, whose spacing passes the decoder's 1e-4 s tolerance once a
    video file holds more than 2048 s of episodes."""
    return float(from_timestamp) + np.asarray(timestamps, dtype=np.float64)


def _decode_image(value: dict) -> np.ndarray:
    """An image feature cell (Hugging Face datasets' {bytes, path} struct) as uint8 [H, W, 3]."""
    from PIL import Image

    source = io.BytesIO(value["bytes"]) if value.get("bytes") else value["path"]
    return np.asarray(Image.open(source).convert("RGB"))
