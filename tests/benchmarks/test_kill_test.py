"""The kill -9 suite, small enough for CI: seeded kills of train, SFT, collect and deploy recover."""

import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kill_test.py"


@pytest.mark.slow
def test_seeded_kills_leave_runs_that_resume_exactly_and_datasets_that_read(tmp_path, capsys):
    kill_test = runpy.run_path(str(SCRIPT))["main"]
    assert kill_test(["--kills", "2", "--seed", "100", "--out", str(tmp_path / "kills.json")]) == 0
    assert "8 kill points, 0 left a run or dataset that does not recover" in capsys.readouterr().out
