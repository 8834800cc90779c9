from __future__ import annotations

import os

import numpy as np
import pytest

from embodrl.data.video import VideoConfig, encode_video, resolve_codec


@pytest.mark.parametrize("codec", ["auto", "libx264"])
def test_encoding_leaves_the_thread_scheduling_alone(tmp_path, codec):
    # As root, SVT-AV1 (the "auto" codec where PyAV has it) would leave this thread at SCHED_FIFO 99.
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    frames = np.random.default_rng(0).integers(0, 255, (6, 32, 32, 3), dtype=np.uint8)
    info = encode_video(tmp_path / "clip.mp4", frames, fps=10, cfg=VideoConfig(codec=codec))
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
    assert info["video.codec"] in ("av1", "h264", "mpeg4") and (tmp_path / "clip.mp4").stat().st_size > 0
    assert resolve_codec(codec) in ("libsvtav1", "libx264", "mpeg4")
