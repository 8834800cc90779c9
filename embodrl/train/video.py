"""Write frame sequences as mp4 (PyAV) or gif."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import numpy as np

from embodrl.errors import UserError

VIDEO_SUFFIXES = (".mp4", ".gif")


def write_video(path: str | Path, frames: list[np.ndarray] | np.ndarray, fps: int = 20) -> Path:
    """Write uint8 frames [T, H, W, 3] to `path` (.mp4 or .gif); returns the path written. Without PyAV an
    mp4 becomes a gif beside it (with a warning): a missing codec must not cost a run its final evaluation."""
    import imageio.v3 as iio

    path = Path(path)
    if path.suffix not in VIDEO_SUFFIXES:
        raise UserError(f"video path {path} must end in one of {', '.join(VIDEO_SUFFIXES)}")
    frames = np.asarray(frames, dtype=np.uint8)
    if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise UserError(f"expected frames [T, H, W, 3], got shape {list(frames.shape)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".mp4" and importlib.util.find_spec("av") is None:
        path = path.with_suffix(".gif")
        warnings.warn(f"PyAV is not installed (pip install av): writing {path.name}", stacklevel=2)
    if path.suffix == ".gif":
        iio.imwrite(path, frames, duration=1000 / fps, loop=0)
    else:
        iio.imwrite(path, frames, fps=fps, codec="libx264", plugin="pyav")
    return path
