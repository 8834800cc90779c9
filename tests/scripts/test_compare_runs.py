"""scripts/compare_runs.py: runs' success against RL minutes or env steps on one figure."""

import json
import runpy
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "compare_runs.py"
script = runpy.run_path(str(SCRIPT))


def write_run(folder: Path, successes: list[float], with_steps: bool = True) -> Path:
    folder.mkdir()
    rows = [
        {
            "iteration": i + 1,
            "time/wall": 60.0 * (i + 1),
            **({"rollout/env_steps": 1000.0 * (i + 1)} if with_steps else {}),
            "rollout/success": s,
            "rollout/intervention_rate": 1.0 - s,
            **({"eval/success": s} if i % 2 else {}),
        }
        for i, s in enumerate(successes)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[16:24]  # the IHDR chunk's width and height
    return int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")


def test_moving_mean_averages_the_last_window_values():
    assert script["moving_mean"]([0.0, 1.0, 1.0, 0.0], 2) == [0.0, 0.5, 1.0, 0.5]


def test_writes_a_figure_of_every_run_and_refuses_a_folder_without_metrics(tmp_path, capsys):
    a, b = write_run(tmp_path / "a", [0.2, 0.4, 0.6]), write_run(tmp_path / "b", [0.5, 0.5, 0.7])
    out = tmp_path / "curves.png"
    assert script["main"]([f"seed 0={a}", f"seed 1={b}", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    tall = tmp_path / "with_panel.png"
    assert script["main"]([f"a={a}", "--panel", "rollout/intervention_rate", "--out", str(tall)]) == 0
    assert png_size(tall)[1] > png_size(out)[1]  # the panel below the success plot
    assert script["main"]([f"x={tmp_path / 'nowhere'}", "--out", str(out)]) == 2
    assert "LABEL=RUN_DIR" in capsys.readouterr().err


def test_env_steps_on_the_x_axis_needs_runs_that_log_them(tmp_path, capsys):
    a = write_run(tmp_path / "a", [0.2, 0.4, 0.6])
    old = write_run(tmp_path / "old", [0.2, 0.4], with_steps=False)
    out = tmp_path / "steps.png"
    assert script["main"]([f"a={a}", "--x", "env-steps", "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert script["main"]([f"a={a}", f"old={old}", "--x", "env-steps", "--out", str(out)]) == 2
    assert "logs no rollout/env_steps" in capsys.readouterr().err
