"""The LeRobotDataset v3.0 on-disk layout: paths, features, parquet columns and statistics.

Mirrors LeRobot's published format (codebase_version "v3.0") so its tooling reads our datasets
and we read its datasets, without depending on the `lerobot` package:

    meta/info.json                                   fps, features, totals, path templates
    meta/stats.json                                  per feature: min/max/mean/std/count/q01..q99
    meta/tasks.parquet                               task string (index) -> task_index
    meta/episodes/chunk-000/file-000.parquet         one row per episode: lengths, file locations, stats
    data/chunk-000/file-000.parquet                  one row per frame
    videos/<video_key>/chunk-000/file-000.mp4        episodes concatenated; per-episode from/to timestamps
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embodrl.errors import UserError

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000  # files per chunk folder
DATA_FILE_SIZE_MB = 100  # a data parquet file is closed once it reaches this size
VIDEO_FILE_SIZE_MB = 500
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
EPISODES_PATH = "meta/episodes/" + CHUNK_FILE + ".parquet"
DATA_PATH = "data/" + CHUNK_FILE + ".parquet"
VIDEO_PATH = "videos/{video_key}/" + CHUNK_FILE + ".mp4"
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)  # stored as q01, q10, q50, q90, q99

# Columns every frame carries, added by the writer (LeRobot's DEFAULT_FEATURES).
DEFAULT_FEATURES: dict[str, dict] = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
# Env observation keys (DESIGN.md §2) -> LeRobot feature names.
LEROBOT_KEYS: dict[str, str] = {
    "state": "observation.state",
    "rgb": "observation.images.main",
    "wrist_rgb": "observation.images.wrist",
    "privileged": "observation.environment_state",
}
ACTION_KEY = "action"
# LeRobot's HIL-SERL names for per-frame labels: 1.0 where the frame shows the task done (its reward
# classifier's label), and True on an episode's last frame
REWARD_KEY = "next.reward"
DONE_KEY = "next.done"
VISUAL_DTYPES = ("video", "image")
NUMERIC_DTYPES = ("float32", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")


def chunk_file(file_number: int) -> dict[str, int]:
    """The n-th file of a kind lives at chunk n // CHUNKS_SIZE, file n % CHUNKS_SIZE."""
    return {"chunk_index": file_number // CHUNKS_SIZE, "file_index": file_number % CHUNKS_SIZE}


def validate_features(features: dict[str, dict]) -> dict[str, dict]:
    """Check user features (LeRobot style: dtype, shape, names) and return them with list shapes."""
    if not features:
        raise UserError(
            "a dataset needs at least one feature, e.g. {'action': {'dtype': 'float32', 'shape': [7]}}"
        )
    out = {}
    for key, ft in features.items():
        if "/" in key:
            raise UserError(f"feature name {key!r} must not contain '/' (LeRobot uses it in column names)")
        if key in DEFAULT_FEATURES:
            raise UserError(f"feature {key!r} is added by the writer; leave it out of `features`")
        if "dtype" not in ft or "shape" not in ft:
            raise UserError(f"feature {key!r} needs 'dtype' and 'shape', got {sorted(ft)}")
        dtype, shape = ft["dtype"], [int(s) for s in ft["shape"]]
        if dtype not in NUMERIC_DTYPES + ("video",):
            raise UserError(
                f"feature {key!r} has dtype {dtype!r}; use one of {', '.join(NUMERIC_DTYPES)} or video"
            )
        if dtype == "video" and (len(shape) != 3 or shape[2] != 3 or shape[0] % 2 or shape[1] % 2):
            raise UserError(f"video feature {key!r} needs shape [H, W, 3] with even H and W, got {shape}")
        if any(s <= 0 for s in shape):
            raise UserError(f"feature {key!r} has shape {shape}; every dimension must be positive")
        names = ft.get("names", ["height", "width", "channels"] if dtype == "video" else None)
        out[key] = {"dtype": dtype, "shape": shape, "names": names}
    return out


def arrow_type(ft: dict) -> pa.DataType:
    """The parquet column type LeRobot (via Hugging Face datasets) uses for a feature."""
    scalar = pa.from_numpy_dtype(np.dtype(ft["dtype"]))
    if list(ft["shape"]) == [1]:
        return scalar
    inner = scalar
    for size in reversed(ft["shape"]):
        inner = pa.list_(inner, size)  # fixed-size list, like datasets.Sequence(length=...)
    return inner


def to_arrow(values: np.ndarray, ft: dict) -> pa.Array:
    """Frames [T, *shape] of one feature as an arrow column."""
    typ = arrow_type(ft)
    flat = pa.array(values.reshape(-1).astype(np.dtype(ft["dtype"])))
    for size in reversed(ft["shape"] if list(ft["shape"]) != [1] else []):
        flat = pa.FixedSizeListArray.from_arrays(flat, size)
    return flat.cast(typ)


def column_to_numpy(column: pa.ChunkedArray | pa.Array, shape: Iterable[int]) -> np.ndarray:
    """A parquet column (scalar, list or fixed-size list) as an array [T, *shape] ([T] for shape [1])."""
    shape = list(shape)
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    while pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type):
        array = array.flatten()
    values = array.to_numpy(zero_copy_only=False)
    return values if shape == [1] else values.reshape(-1, *shape)


def feature_stats(values: np.ndarray, axis: tuple[int, ...] | int = 0) -> dict[str, np.ndarray]:
    """min/max/mean/std/count and quantiles over `axis`, as LeRobot stores them."""
    values = values.astype(np.float64)
    out = {
        "min": values.min(axis),
        "max": values.max(axis),
        "mean": values.mean(axis),
        "std": values.std(axis),
        "count": np.array([values.shape[0]]),
    }
    for q, value in zip(QUANTILES, np.quantile(values, QUANTILES, axis=axis), strict=True):
        out[f"q{round(q * 100):02d}"] = value
    return {k: np.atleast_1d(v) for k, v in out.items()}


def image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel stats of uint8 frames [T, H, W, 3] in [0, 1], shaped [3, 1, 1] (LeRobot's layout).

    LeRobot samples about 100 frames per episode (more for long ones) and downsamples large images.
    """
    n = len(frames)
    count = max(min(n, 100), min(int(n**0.75), 10_000))
    frames = frames[np.round(np.linspace(0, n - 1, count)).astype(int)]
    if max(frames.shape[1:3]) >= 300:
        step = int(max(frames.shape[1:3]) / 150)
        frames = frames[:, ::step, ::step]
    stats = feature_stats(frames.transpose(0, 3, 1, 2) / 255.0, axis=(0, 2, 3))
    return {k: v if k == "count" else v.reshape(3, 1, 1) for k, v in stats.items()}


def aggregate_stats(per_episode: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Combine per-episode stats of one feature: exact min/max/mean/std, count-weighted quantiles."""
    counts = np.array([float(s["count"][0]) for s in per_episode])
    weights = (counts / counts.sum()).reshape(-1, *[1] * per_episode[0]["mean"].ndim)
    means = np.stack([s["mean"] for s in per_episode])
    mean = (weights * means).sum(0)
    var = (weights * (np.stack([s["std"] for s in per_episode]) ** 2 + (means - mean) ** 2)).sum(0)
    out = {
        "min": np.stack([s["min"] for s in per_episode]).min(0),
        "max": np.stack([s["max"] for s in per_episode]).max(0),
        "mean": mean,
        "std": np.sqrt(var),
        "count": np.array([int(counts.sum())]),
    }
    for key in per_episode[0]:
        if key.startswith("q"):
            out[key] = (weights * np.stack([s[key] for s in per_episode])).sum(0)
    return out


def stats_to_json(stats: dict[str, dict[str, np.ndarray]]) -> dict:
    return {key: {k: np.asarray(v).tolist() for k, v in s.items()} for key, s in stats.items()}


def stats_from_json(data: dict) -> dict[str, dict[str, np.ndarray]]:
    return {key: {k: np.asarray(v) for k, v in s.items()} for key, s in data.items()}


def write_json_atomic(path: Path, data: dict) -> None:
    """Write JSON via a temporary file and a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=4))
    os.replace(tmp, path)


def write_parquet_atomic(path: Path, table: pa.Table) -> None:
    """Write a parquet file via a temporary name (not matched by LeRobot's `*.parquet` globs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def tasks_table(tasks: list[str]) -> pa.Table:
    """meta/tasks.parquet as pandas saves LeRobot's DataFrame(task_index) indexed by task strings."""
    table = pa.table(
        {"task_index": pa.array(range(len(tasks)), pa.int64()), "task": pa.array(tasks, pa.string())}
    )
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": "task",
                "field_name": "task",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def read_tasks(path: Path) -> list[str]:
    """Task strings ordered by task_index, from a tasks.parquet written by pandas (named or unnamed index)."""
    table = pq.read_table(path)
    if "task_index" not in table.column_names:
        raise UserError(f"{path} has no task_index column; is this a LeRobot v3 dataset?")
    text_columns = [c for c in table.column_names if c != "task_index"]
    if not text_columns:
        raise UserError(f"{path} holds no task strings (expected a 'task' column or pandas index)")
    order = np.argsort(table.column("task_index").to_numpy())
    texts = table.column(text_columns[0]).to_pylist()
    return [texts[i] for i in order]
