"""`embodrl sft env=none`: a policy trained from a robot's dataset alone (sizes, normalization, tasks and
key names from the dataset), validated on held-out episodes, then served and deployed under the dataset's
own key names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embodrl.config import compose, make_run_dir
from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.deploy.client import PolicyClient
from embodrl.deploy.commands import checkpoint_server, deploy
from embodrl.deploy.config import DeployConfig, RobotConfig, SafetyConfig, ServerConfig
from embodrl.errors import UserError
from embodrl.policies.loading import load_policy
from embodrl.train.sft_runner import SFTRunner
from tests.data.robot_dataset import write_robot_dataset

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


FIXTURES = Path(__file__).parents[1] / "fixtures" / "lerobot"  # written by LeRobot 0.4.4 itself
# dataset -> (the policy's inputs, the request keys its server speaks, the actions' kind: LeRobot arms report
# their joints under the action's names, so absolute targets start from the present position)
CASES = {
    "ours": ("[rgb,wrist_rgb,state]", ("observation.images.front", "observation.images.wrist"), "absolute"),
    "so100_video": (
        "[rgb,wrist_rgb,state]",
        ("observation.images.front", "observation.images.wrist"),
        "absolute",
    ),
    "images_parquet": ("[rgb,state]", ("observation.images.top", "observation/wrist_image"), "delta"),
}


def _wide_safety(action_type: str) -> SafetyConfig:
    """A robot in joint degrees: bounds and jumps far wider than the tabletop's defaults."""
    wide = 1e4
    return SafetyConfig(
        action_type=action_type,
        action_low=(-wide,),
        action_high=(wide,),
        gripper_low=-wide,
        gripper_high=wide,
        max_chunk_jump=None,
    )


@pytest.fixture(scope="module", params=list(CASES))
def trained(request, tmp_path_factory, dataset):
    """(dataset folder, its image policy after a few SFT steps, the request keys expected, action kind)."""
    folder = dataset if request.param == "ours" else FIXTURES / request.param
    obs_keys, keys, action_type = CASES[request.param]
    runner = _runner(
        tmp_path_factory.mktemp("runs"),
        folder,
        f"policy.obs_keys={obs_keys}",
        "sft.steps=2",
        "sft.eval_every=0",
    )
    runner.learn()
    return folder, runner.run_dir / "checkpoints/last/policy", keys, action_type


def _request(folder: Path) -> dict:
    """The first frame of `folder` under its own feature names, as a client on that robot sends it."""
    frame = LeRobotDataset(folder).frame(0)
    request = {key: frame[key] for key in frame if key.startswith("observation.")}
    return {**request, "task": frame["task"]}


def test_serve_speaks_the_dataset_key_names(trained):
    folder, checkpoint, (image, wrist_image), _ = trained
    server = checkpoint_server(str(checkpoint), ServerConfig(port=0)).start()
    try:
        with PolicyClient(f"ws://127.0.0.1:{server.port}") as client:
            keys = client.metadata["observation_keys"]
            assert (keys["image"], keys["wrist_image"], keys["prompt"]) == (image, wrist_image, "task")
            assert keys["state"] == ["observation.state"]
            reply = client.infer(_request(folder))
        action_dim = LeRobotDataset(folder).features["action"]["shape"][0]
        assert np.asarray(reply["actions"]).shape == (4, action_dim)
    finally:
        server.stop()


@pytest.mark.parametrize("remote", [False, True])
def test_deploy_replays_the_recording_under_its_robot_names(trained, remote):
    folder, checkpoint, _, action_type = trained
    server = checkpoint_server(str(checkpoint), ServerConfig(port=0)).start() if remote else None
    episodes = LeRobotDataset(folder)
    try:
        cfg = DeployConfig(
            policy=f"ws://127.0.0.1:{server.port}" if remote else str(checkpoint),
            fps=100.0,
            episodes=2,
            max_steps=100,
            robot=RobotConfig(kind="replay", dataset=str(folder), episode=1),
            safety=_wide_safety(action_type),
        )
        results = deploy(cfg)  # robot.camera / wrist_camera come from the dataset's camera names
    finally:
        if server is not None:
            server.stop()
    lengths = [int(np.subtract(*episodes.episode_range(e)[::-1])) for e in (1, 2)]
    assert [r.steps for r in results] == lengths
    assert all(r.stop_reason == "task_done" and r.inference_errors == 0 for r in results)
    assert all(r.chunks > 0 and r.safety["rejected_chunks"] == 0 for r in results)
