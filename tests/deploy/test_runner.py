"""CheckpointRunner: a saved embodrl policy served end to end."""

import numpy as np
import pytest

from embodrl.deploy.client import PolicyClient
from embodrl.deploy.config import ServerConfig
from embodrl.deploy.runner import CheckpointRunner
from embodrl.deploy.server import PolicyServer
from embodrl.errors import UserError
from embodrl.policies.config import PolicyConfig
from embodrl.policies.registry import make_policy


def _save(tmp_path, obs_keys=("rgb", "state"), family="gaussian", value_obs_keys=()):
    normalization = "quantile" if family == "diffusion" else "mean_std"
    cfg = PolicyConfig(
        family=family,
        chunk_size=4,
        action_dim=7,
        obs_keys=obs_keys,
        value_obs_keys=value_obs_keys,
        action_normalization=normalization,
    )
    policy = make_policy(cfg, {"rgb": (16, 16, 3), "state": (5,), "privileged": (3,)})
    policy.save_pretrained(tmp_path)
    return policy


def test_checkpoint_served_over_websocket(tmp_path):
    _save(tmp_path)
    runner = CheckpointRunner(tmp_path)
    assert runner.input_spec["rgb"].shape == (16, 16, 3) and runner.input_spec["state"].dtype == "float32"
    obs = {
        "observation/image": np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8),
        "observation/state": np.linspace(-1, 1, 5).astype(np.float32),
        "prompt": "reach the red cube",
    }
    with (
        PolicyServer(runner, ServerConfig(port=0)) as server,
        PolicyClient(f"ws://127.0.0.1:{server.port}") as client,
    ):
        assert client.metadata["family"] == "gaussian" and client.metadata["action_horizon"] == 4
        first, second = client.infer(obs)["actions"], client.infer(obs)["actions"]
    assert first.shape == (4, 7) and np.all(np.isfinite(first))
    np.testing.assert_array_equal(first, second)  # deterministic: the mean chunk


def test_policy_reading_privileged_state_is_refused(tmp_path):
    _save(tmp_path, obs_keys=("state", "privileged"))
    with pytest.raises(UserError, match="privileged"):
        CheckpointRunner(tmp_path)


@pytest.mark.parametrize("family", ["gaussian", "flow", "diffusion"])
def test_a_checkpoint_whose_critic_reads_privileged_state_is_served_without_it(tmp_path, family):
    """The pick_image_dppo recipe's critic reads `privileged`: once, the server started and then failed
    every request; the robot never sends it and the served action needs no value."""
    _save(tmp_path, obs_keys=("state",), family=family, value_obs_keys=("state", "privileged"))
    runner = CheckpointRunner(tmp_path)
    assert "privileged" not in runner.input_spec
    actions = runner.infer_batch([{"state": np.linspace(-1, 1, 5).astype(np.float32)}])
    assert actions.shape == (1, 4, 7) and np.all(np.isfinite(actions))
