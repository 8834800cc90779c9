import importlib.util

import imageio.v3 as iio
import numpy as np
import pytest

from embodrl.errors import UserError
from embodrl.train import video
from embodrl.train.video import write_video


def _frames(t: int = 3) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, size=(t, 16, 16, 3), dtype=np.uint8)


def test_mp4_and_gif_round_trip_their_frame_count(tmp_path):
    for name in ("a.mp4", "a.gif"):
        path = write_video(tmp_path / name, _frames(4))
        assert path == tmp_path / name
        assert len(iio.imread(path, index=None)) == 4


def test_without_pyav_an_mp4_becomes_a_gif_with_a_warning(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(video.importlib.util, "find_spec", lambda name: None if name == "av" else real(name))
    with pytest.warns(UserWarning, match="PyAV is not installed"):
        path = write_video(tmp_path / "episode_000.mp4", _frames())
    assert path == tmp_path / "episode_000.gif" and path.is_file()
    assert not (tmp_path / "episode_000.mp4").exists()


def test_bad_suffix_and_bad_shape_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="must end in"):
        write_video(tmp_path / "a.avi", _frames())
    with pytest.raises(UserError, match=r"expected frames \[T, H, W, 3\]"):
        write_video(tmp_path / "a.mp4", np.zeros((2, 8, 8), dtype=np.uint8))
