"""Deploy configs: YAML + overrides, validation messages."""

import pytest

from embodrl.deploy.config import ChunkConfig, DeployConfig, RobotConfig, ServerConfig, load_config
from embodrl.errors import ConfigError


def test_load_yaml_and_overrides(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(
        "policy: ws://gpu:8000\nfps: 15\nchunk: {mode: rtc, action_horizon: 8, execute_steps: 5}\n"
    )
    cfg = load_config(DeployConfig, str(path), ["safety.max_velocity=[0.5]", "robot.seed=4"])
    assert cfg.remote and cfg.fps == 15 and cfg.chunk.mode == "rtc" and cfg.chunk.action_horizon == 8
    assert cfg.safety.max_velocity == (0.5,) and cfg.robot.seed == 4
    assert load_config(ServerConfig, None, ["port=0", "api_key=k"]).api_key == "k"


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: load_config(DeployConfig, None, ["policy=x", "fsp=3"]), "fsp"),
        (lambda: load_config(DeployConfig, None, ["fps=3"]), "deploy.policy is empty"),
        (lambda: ChunkConfig(mode="smooth"), "open_loop"),
        (lambda: ChunkConfig(mode="rtc", execute_steps=2, inference_delay_steps=2), "inference_delay_steps"),
        (lambda: ServerConfig(api_key=""), "api_key is empty"),
        (lambda: RobotConfig(kind="lerobot"), "lerobot_config"),
        (lambda: RobotConfig(kind="franka"), "franka_host"),
        (lambda: load_config(DeployConfig, None, ["policy=x", "teleop.step=0"]), "teleop.step"),
        (
            lambda: load_config(
                DeployConfig, None, ["policy=x", "teleop.keyboard=true", "safety.action_type=absolute"]
            ),
            "delta actions only",
        ),
    ],
)
def test_invalid_configs_explain_themselves(build, message):
    with pytest.raises(ConfigError, match=message):
        build()
