"""The built wheel carries everything a non-editable install needs: every config preset."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_holds_every_config_preset(tmp_path):
    src = tmp_path / "src"  # a copy of the tracked files: setuptools writes build/ beside the sources
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in tracked.stdout.splitlines():
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "-w", str(tmp_path), str(src)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("embodrl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").glob("*/*.yaml"))
    assert len(presets) > 10
    missing = [p for p in presets if f"embodrl/{p}" not in names]
    assert not missing, f"presets missing from the wheel: {missing}"
    assert "embodrl/sims/tabletop/env.py" in names and "embodrl/policies/flow/modeling.py" in names
