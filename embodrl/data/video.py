"""mp4 encoding, concatenation and timestamp-based decoding with PyAV, as LeRobot datasets store video."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from embodrl.choices import check_choice
from embodrl.errors import UserError

# SVT-AV1 prints a banner per encoder on stderr unless told otherwise (1 = errors only).
os.environ.setdefault("SVT_LOG", "1")

CODECS = ("auto", "libsvtav1", "libx264", "mpeg4")
CODEC_NAMES = {"libsvtav1": "av1", "libx264": "h264", "mpeg4": "mpeg4"}  # as ffprobe reports them


@dataclass
class VideoConfig:
    """How camera frames are encoded; defaults are LeRobot's (AV1, yuv420p, crf 30, a key frame every 2)."""

    codec: str = "auto"  # auto: libsvtav1 when this PyAV build has it, else libx264
    crf: int = 30
    gop: int = 2  # frames between key frames: small = fast random access
    preset: int = 12  # libsvtav1 speed preset (LeRobot's default)

    def __post_init__(self) -> None:
        check_choice("video.codec", self.codec, CODECS)


@cache
def resolve_codec(codec: str) -> str:
    """The encoder to use for `codec` ("auto": AV1 if available, like LeRobot; else h264)."""
    import av

    available = av.codecs_available
    if codec != "auto":
        if codec not in available:
            raise UserError(f"video codec {codec!r} is not in this PyAV build; use video.codec=auto")
        return codec
    return next(c for c in ("libsvtav1", "libx264", "mpeg4") if c in available)


@contextmanager
def keep_thread_scheduling() -> Iterator[None]:
    """Undo scheduling changes a codec makes to the calling thread.

    SVT-AV1, run as root (as in most containers), switches the thread that opens an encoder to
    real-time SCHED_FIFO priority 99 and leaves it there: every later thread of a collect or deploy
    process would inherit it and could starve the rest of the machine.
    """
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if (os.sched_getscheduler(0), os.sched_getparam(0)) != (policy, param):
            os.sched_setscheduler(0, policy, param)


def encode_video(path: Path, frames: np.ndarray, fps: int, cfg: VideoConfig) -> dict:
    """Encode uint8 frames [T, H, W, 3] as yuv420p mp4 at `fps`; returns LeRobot's video info dict."""
    import av

    codec = resolve_codec(cfg.codec)
    path.parent.mkdir(parents=True, exist_ok=True)
    height, width = frames.shape[1:3]
    options = {"g": str(cfg.gop), "crf": str(cfg.crf)}
    if codec == "libsvtav1":
        options["preset"] = str(cfg.preset)
    if codec == "libx264":
        options["bf"] = "0"  # no B-frames: decode order == display order, simple concatenation
    with keep_thread_scheduling(), av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=fps, options=options)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for image in frames:
            for packet in stream.encode(
                av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            ):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return {
        "video.height": int(height),
        "video.width": int(width),
        "video.codec": CODEC_NAMES.get(codec, codec),
        "video.pix_fmt": "yuv420p",
        "video.is_depth_map": False,
        "video.fps": int(fps),
        "video.channels": 3,
        "has_audio": False,
    }


def concat_videos(parts: list[tuple[Path, float]], out: Path) -> None:
    """Concatenate mp4 files encoded with the same settings without re-encoding.

    `parts` lists (path, start time in seconds in the output); packets are shifted by that start.
    """
    import av

    out.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(out), "w", format="mp4") as output:
        stream = None
        for path, start in parts:
            with av.open(str(path)) as source:
                src = source.streams.video[0]
                if stream is None:
                    stream = output.add_stream_from_template(src, opaque=True)
                shift = round(start / src.time_base)
                for packet in source.demux(src):
                    if packet.dts is None:  # the flush packet at the end of a stream
                        continue
                    packet.pts += shift
                    packet.dts += shift
                    packet.stream = stream
                    output.mux(packet)


def decode_frames(path: Path, timestamps: np.ndarray, tolerance_s: float = 1e-4) -> np.ndarray:
    """Frames [T, H, W, 3] uint8 shown at `timestamps` (seconds, sorted), like LeRobot's video queries.

    Seeks to the key frame before the first timestamp and decodes forward; a timestamp with no frame
    within `tolerance_s` is an error (the episode table and the video disagree).
    """
    import av

    timestamps = np.asarray(timestamps, dtype=np.float64)
    first, last = timestamps[0], timestamps[-1]
    times, images = [], []
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        container.seek(max(0, int(first / stream.time_base)), stream=stream, backward=True)
        for frame in container.decode(stream):
            t = float(frame.pts * stream.time_base)
            if t < first - tolerance_s:
                continue
            if t > last + tolerance_s:
                break
            times.append(t)
            images.append(frame.to_ndarray(format="rgb24"))
    if not times:
        raise UserError(f"{path} has no frames between {first:.4f}s and {last:.4f}s")
    times = np.asarray(times)
    nearest = np.abs(times[None, :] - timestamps[:, None]).argmin(1)
    gap = np.abs(times[nearest] - timestamps)
    if (gap > tolerance_s).any():
        bad = timestamps[gap > tolerance_s][:3].round(4).tolist()
        raise UserError(
            f"{path}: no frame within {tolerance_s}s of timestamps {bad}; "
            "the episode table and the video disagree"
        )
    return np.stack([images[i] for i in nearest])
