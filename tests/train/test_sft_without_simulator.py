"""`embodrl sft env=none`: a policy trained from a robot's dataset alone (sizes, normalization, tasks and
key names from the dataset), validated on held-out episodes, then served and deployed under the dataset's
own key names."""

from __future__ import annotations

import json

import numpy as np
import pytest

from embodrl.config import compose, make_run_dir
from embodrl.deploy.client import PolicyClient
from embodrl.deploy.commands import checkpoint_server, deploy
from embodrl.deploy.config import DeployConfig, RobotConfig, ServerConfig
from embodrl.errors import UserError
from embodrl.policies.loading import load_policy
from embodrl.train.sft_runner import SFTRunner
from tests.data.robot_dataset import SIZE, TASKS, write_robot_dataset

LENGTH = 12
RUN = ["env=none", "policy=flow_state", "sft.batch_size=32", "sft.videos=0", "train.tensorboard=false"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_robot_dataset(tmp_path_factory.mktemp("robot") / "so100", episodes=6, length=LENGTH)


def _runner(tmp_path, dataset, *overrides: str) -> SFTRunner:
    cfg = compose(None, [*RUN, f"sft.dataset={dataset}", f"run_root={tmp_path}", *overrides])
    return SFTRunner(cfg, make_run_dir(cfg))


def test_a_state_policy_learns_from_the_dataset_and_validates_on_held_out_episodes(tmp_path, dataset):
    runner = _runner(tmp_path, dataset, "policy.obs_keys=[state]", "sft.steps=150", "sft.eval_every=150")
    assert runner.num_samples == 5 * LENGTH and len(runner.val_frames) == LENGTH  # a tenth, at least one
    before = runner.evaluate()
    summary = runner.learn()
    assert summary["val/action_mae"] < 0.75 * before["val/action_mae"]
    logged = [json.loads(line) for line in (runner.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert logged[-1]["val/loss"] == pytest.approx(summary["val/loss"])
    policy = load_policy(runner.run_dir / "checkpoints/last/policy")
    assert policy.cfg.action_dim == 6  # from the dataset, not the preset's 7
    assert policy.cfg.dataset_features == {"state": "observation.state"}
    assert policy.cfg.value_obs_keys == ("state",)  # the preset's privileged critic has no source here


def test_a_simulator_command_with_env_none_is_refused_in_one_line(tmp_path, dataset):
    from embodrl.sims.config import EnvConfig
    from embodrl.sims.registry import make_env

    with pytest.raises(UserError, match="no simulator") as error:
        make_env(EnvConfig(suite="none"))
    assert "\n" not in str(error.value)


@pytest.fixture(scope="module")
def image_checkpoint(tmp_path_factory, dataset):
    runner = _runner(
        tmp_path_factory.mktemp("runs"),
        dataset,
        "policy.obs_keys=[rgb,wrist_rgb,state]",
        "sft.steps=2",
        "sft.eval_every=0",
    )
    runner.learn()
    return runner.run_dir / "checkpoints/last/policy"


def test_serve_speaks_the_dataset_key_names(image_checkpoint):
    server = checkpoint_server(str(image_checkpoint), ServerConfig(port=0)).start()
    try:
        with PolicyClient(f"ws://127.0.0.1:{server.port}") as client:
            keys = client.metadata["observation_keys"]
            assert (keys["image"], keys["wrist_image"], keys["prompt"]) == (
                "observation.images.front",
                "observation.images.wrist",
                "task",
            )
            assert keys["state"] == ["observation.state"]
            frame = np.zeros((SIZE, SIZE, 3), np.uint8)
            reply = client.infer(
                {
                    "observation.images.front": frame,
                    "observation.images.wrist": frame,
                    "observation.state": np.zeros(6, np.float32),
                    "task": TASKS[0],
                }
            )
        assert np.asarray(reply["actions"]).shape == (4, 6)
    finally:
        server.stop()


@pytest.mark.parametrize("remote", [False, True])
def test_deploy_replays_the_recording_under_its_robot_names(image_checkpoint, dataset, remote):
    server = checkpoint_server(str(image_checkpoint), ServerConfig(port=0)).start() if remote else None
    try:
        policy = f"ws://127.0.0.1:{server.port}" if remote else str(image_checkpoint)
        cfg = DeployConfig(
            policy=policy,
            fps=100.0,
            episodes=2,
            max_steps=50,
            robot=RobotConfig(kind="replay", dataset=str(dataset), episode=4),
        )
        results = deploy(cfg)  # robot.camera / wrist_camera come from the dataset (front, wrist)
    finally:
        if server is not None:
            server.stop()
    assert [r.steps for r in results] == [LENGTH, LENGTH]
    assert all(r.stop_reason == "task_done" and r.inference_errors == 0 for r in results)
