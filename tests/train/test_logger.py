"""MetricsLogger's wandb sink: what it sends, one wandb run per run folder across --resume, clear errors."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from embodrl.config import compose
from embodrl.errors import UserError
from embodrl.train.logger import WANDB_ID_FILE, MetricsLogger, WandbTarget, wandb_target

TARGET = WandbTarget("proj", "team", "exp", "rl", {"algo": {"name": "ppo"}, "seed": 3})


class RecordingWandb:
    """Stands in for the wandb module: records init arguments, logged rows and finish."""

    def __init__(self) -> None:
        self.inits: list[dict] = []
        self.rows: list[tuple[int, dict]] = []
        self.finished = 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return SimpleNamespace(id=kwargs["id"] or f"new{len(self.inits)}", log=self.log, finish=self.finish)

    def log(self, row: dict, step: int) -> None:
        self.rows.append((step, dict(row)))

    def finish(self) -> None:
        self.finished += 1


def test_metrics_go_to_wandb_at_their_iteration_and_a_resume_continues_the_same_run(tmp_path, monkeypatch):
    fake = RecordingWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run_dir = tmp_path / "exp" / "20260101-000000"
    run_dir.mkdir(parents=True)
    logger = MetricsLogger(run_dir, 3, tensorboard=False, wandb=TARGET)
    logger.log(1, {"eval/success": 0.25})
    logger.log(2, {"train/approx_kl": 0.01})
    logger.close()
    first = fake.inits[0]
    assert first["project"] == "proj" and first["entity"] == "team" and first["group"] == "exp"
    assert first["job_type"] == "rl" and first["config"] == TARGET.config
    assert first["id"] is None and first["resume"] is None  # a new run: wandb names it
    assert first["name"] == "exp/20260101-000000" and first["dir"] == str(run_dir)
    assert (run_dir / WANDB_ID_FILE).read_text() == "new1"
    resumed = MetricsLogger(run_dir, 3, start=2, tensorboard=False, wandb=TARGET)  # as --resume does
    resumed.log(3, {"eval/success": 0.5})
    resumed.close()
    assert fake.inits[1]["id"] == "new1" and fake.inits[1]["resume"] == "allow"
    expected = [(1, {"eval/success": 0.25}), (2, {"train/approx_kl": 0.01}), (3, {"eval/success": 0.5})]
    assert fake.rows == expected
    assert fake.finished == 2


def test_wandb_target_follows_the_train_config():
    assert wandb_target(compose(None, []), "rl") is None  # off by default
    cfg = compose(None, ["train.wandb=true", "train.wandb_project=p", "name=lift"])
    target = wandb_target(cfg, "sft")
    assert (target.project, target.entity, target.group, target.job_type) == ("p", "", "lift", "sft")
    assert target.config["train"]["wandb_project"] == "p" and target.config["name"] == "lift"


def test_without_the_wandb_package_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(UserError, match=r"pip install 'embodrl\[wandb\]'"):
        MetricsLogger(tmp_path, 1, tensorboard=False, wandb=TARGET)


def test_an_offline_wandb_run_resumes_under_its_id(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network: the run is written for `wandb sync`
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "exp" / "20260101-000000"
    run_dir.mkdir(parents=True)
    for start in (0, 1):
        logger = MetricsLogger(run_dir, 2, start=start, tensorboard=False, wandb=TARGET)
        logger.log(start + 1, {"eval/success": 0.5})
        logger.close()
    run_id = (run_dir / WANDB_ID_FILE).read_text()
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))  # offline-run-<time>-<id>[-k]
    assert len(runs) == 2 and all(f"-{run_id}" in run.name for run in runs)  # one per session, one id
    assert all((run / f"run-{run_id}.wandb").stat().st_size > 0 for run in runs)
