"""The deploy loop: a sim robot completes a task through the remote server; safety holds under faults."""

import os
import signal

import numpy as np
import pytest

from embodrl.cli import sigterm_interrupts
from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.deploy.commands import deploy
from embodrl.deploy.config import ChunkConfig, DeployConfig, RobotConfig, SafetyConfig, ServerConfig
from embodrl.deploy.inference import LocalPolicy
from embodrl.deploy.loop import ControlLoop
from embodrl.deploy.runner import InputSpec, PolicyRunner
from embodrl.deploy.server import PolicyServer
from embodrl.deploy.sim_robot import SimRobot
from embodrl.errors import Terminated, UserError
from tests.deploy.fakes import HORIZON, FakeRobot, FakeRunner, NaNRunner

FAST = {"fps": 100.0, "max_steps": 40}
FAKE_ROBOT_SAFETY = SafetyConfig(  # FakeRobot takes absolute targets: holding = repeating the last one
    action_type="absolute", max_chunk_jump=None, watchdog_hold_s=0.05, watchdog_stop_s=0.15
)


class ExpertRunner(PolicyRunner):
    """Serves the sim's scripted expert (read from the simulated robot in this process) as chunks."""

    def __init__(self, robot: SimRobot, horizon: int) -> None:
        self.robot, self.action_horizon, self.action_dim = robot, horizon, 7
        self.input_spec = {"state": InputSpec((17,), "float32"), "instruction": InputSpec((), "str", True)}
        self.prompts: list[str] = []

    def infer_batch(self, observations: list[dict]) -> np.ndarray:
        self.prompts += [o.get("instruction", "") for o in observations]
        expert = self.robot.env.expert_actions()[0].numpy()  # [7]
        return np.repeat(expert[None, None], self.action_horizon, axis=1)  # [1, H, 7]


@pytest.mark.parametrize(
    "chunk",
    [
        ChunkConfig(mode="open_loop", action_horizon=2, execute_steps=1),
        ChunkConfig(mode="rtc", action_horizon=4, execute_steps=3, inference_delay_steps=1),
    ],
    ids=["open_loop", "rtc"],
)
def test_sim_robot_completes_reach_through_remote_server(tmp_path, chunk):
    robot_cfg = RobotConfig(kind="sim", task="reach", seed=3)
    robot = SimRobot(robot_cfg)
    runner = ExpertRunner(robot, chunk.action_horizon)
    with PolicyServer(runner, ServerConfig(port=0)) as server:
        cfg = DeployConfig(
            policy=f"ws://127.0.0.1:{server.port}",
            robot=robot_cfg,
            chunk=chunk,
            record_dir=str(tmp_path / "episodes"),
            **FAST,
        )
        (stats,) = deploy(cfg, robot=robot)
    assert stats.success and stats.stop_reason == "task_done", stats
    assert stats.chunks > 0 and stats.safety["non_finite_actions"] == 0
    assert runner.prompts[0] in robot.env.instruction_table  # the sim's instruction went out as the prompt
    data = LeRobotDataset(tmp_path / "episodes")
    assert data.num_episodes == 1 and data.num_frames == stats.steps
    assert data.column("action").shape == (stats.steps, 7)
    assert "intervention" in data.info["features"] and "action.requested" in data.info["features"]


def _loop(runner, robot=None, **cfg_overrides) -> ControlLoop:
    cfg = DeployConfig(
        policy="local",
        chunk=ChunkConfig(action_horizon=HORIZON, execute_steps=2),
        safety=FAKE_ROBOT_SAFETY,
        robot=RobotConfig(camera="cam"),
        **{**FAST, **cfg_overrides},
    )
    return ControlLoop(cfg, robot or FakeRobot(), LocalPolicy(runner, cfg.keys))


def _all_finite_and_bounded(robot: FakeRobot) -> bool:
    values = np.array([[a[k] for k in ("x.pos", "y.pos", "gripper")] for a in robot.sent])
    return bool(np.all(np.isfinite(values)) and np.all(np.abs(values) <= 1.0))


def test_local_policy_runs_and_clamps():
    robot = FakeRobot()
    loop = _loop(FakeRunner(), robot, max_steps=12)
    stats = loop.run_episode("pick")
    loop.close()
    assert stats.steps == 12 and stats.stop_reason == "max_steps"
    assert _all_finite_and_bounded(robot)
    assert stats.safety["bounds_clamps"] > 0  # FakeRunner's chunks grow past 1


def test_nan_chunks_never_reach_the_robot():
    robot = FakeRobot()
    loop = _loop(NaNRunner(), robot)
    stats = loop.run_episode("")
    loop.close()
    assert stats.safety["rejected_chunks"] > 0 and stats.chunks == 0
    assert robot.sent and _all_finite_and_bounded(robot)
    assert stats.stop_reason == "safe_stop"  # only holds: the watchdog ends it


def test_watchdog_holds_then_stops_when_inference_is_late():
    runner, robot = FakeRunner(), FakeRobot()
    runner.gate.clear()  # inference never returns during the episode
    loop = _loop(runner, robot, max_steps=1000)
    try:
        stats = loop.run_episode("")
    finally:
        runner.gate.set()
        loop.close()
    assert stats.stop_reason == "safe_stop" and stats.steps < 1000
    assert stats.safety["watchdog_holds"] > 0 and stats.safety["safe_stops"] == 1
    assert all(a["x.pos"] == 0.0 and a["y.pos"] == 0.0 for a in robot.sent)  # only holds were sent


def test_robot_failure_sends_hold_then_propagates():
    robot = FakeRobot(fail_at_step=3)
    loop = _loop(FakeRunner(), robot)
    with pytest.raises(OSError, match="motor bus"):
        loop.run_episode("")
    loop.close()
    assert len(robot.sent) == 4 and robot.sent[-1] == robot.sent[-2]  # 3 steps, then hold the last target
    assert loop.safety.counters.safe_stops == 1


class SigtermRobot(FakeRobot):
    """Receives a SIGTERM (`docker stop`, systemd, `kill`) while it reports its third observation."""

    def get_observation(self) -> dict:
        if len(self.sent) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().get_observation()


def test_sigterm_sends_hold_then_stops_the_command():
    robot = SigtermRobot()
    loop = _loop(FakeRunner(), robot)
    with pytest.raises(Terminated), sigterm_interrupts():  # what `embodrl deploy` runs inside
        loop.run_episode("")
    loop.close()
    assert len(robot.sent) == 4 and robot.sent[-1] == robot.sent[-2]  # 3 steps, then hold the last target
    assert loop.safety.counters.safe_stops == 1


def test_teleop_intervention_takes_over():
    robot = FakeRobot()
    human = np.array([0.1, -0.1, 0.0])
    cfg = DeployConfig(
        policy="local",
        chunk=ChunkConfig(action_horizon=HORIZON),
        safety=FAKE_ROBOT_SAFETY,
        robot=RobotConfig(camera="cam"),
        max_steps=5,
        fps=100,
    )
    loop = ControlLoop(cfg, robot, LocalPolicy(FakeRunner(), cfg.keys), intervention=lambda obs: human)
    stats = loop.run_episode("")
    loop.close()
    assert stats.teleop_steps == 5
    assert all(a["x.pos"] == pytest.approx(0.1) for a in robot.sent)


def test_horizon_and_action_size_mismatch_are_refused():
    keys = DeployConfig(policy="local").keys
    long_chunks = DeployConfig(policy="local", chunk=ChunkConfig(action_horizon=8, execute_steps=8))
    with pytest.raises(UserError, match="chunk.action_horizon=4"):
        ControlLoop(long_chunks, FakeRobot(), LocalPolicy(FakeRunner(), keys))
    narrow = FakeRunner()
    narrow.action_dim = 2
    with pytest.raises(UserError, match="2-D actions but the robot takes 3"):
        ControlLoop(DeployConfig(policy="local"), FakeRobot(), LocalPolicy(narrow, keys))


def test_deploy_exits_non_zero_when_episodes_end_in_a_safe_stop(capsys):
    """Once, a deploy whose every request failed safe-stopped each episode and exited 0."""
    from embodrl.cli import main

    class NaNChunks(PolicyRunner):  # shaped for the stand-in robot; every chunk is refused: holds only
        action_horizon, action_dim = 4, 7
        input_spec = {"state": InputSpec((17,), "float32"), "instruction": InputSpec((), "str", True)}

        def infer_batch(self, observations: list[dict]) -> np.ndarray:
            return np.full((len(observations), 4, 7), np.nan, np.float32)

    with PolicyServer(NaNChunks(), ServerConfig(port=0)) as server:
        args = ["deploy", f"policy=ws://127.0.0.1:{server.port}", "fps=100", "max_steps=40", "episodes=2"]
        args += ["safety.watchdog_hold_s=0.05", "safety.watchdog_stop_s=0.15"]
        assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("embodrl deploy: error: 2 of 2 episode(s) ended in a safe stop")


def test_a_hung_inference_does_not_keep_the_process_alive():
    """Once, an inference that never returned kept `embodrl deploy` running after its episodes ended."""
    import subprocess
    import sys
    import time

    script = (
        "import time\n"
        "from embodrl.deploy.inference import BackgroundInference\n"
        "class Hangs:\n"
        "    action_horizon, action_dim = 4, 7\n"
        "    def infer(self, request):\n"
        "        time.sleep(120)\n"
        "inference = BackgroundInference(Hangs())\n"
        "inference.submit({}, 0)\n"
        "inference.wait(0.2)\n"
        "inference.close()\n"
    )
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert time.monotonic() - start < 30


def test_an_image_policy_without_robot_camera_is_refused_at_start(tmp_path):
    """Once, deploy warned every tick that the request lacked the image, then exited 0."""
    from embodrl.policies.config import PolicyConfig
    from embodrl.policies.registry import make_policy

    cfg = PolicyConfig(family="gaussian", chunk_size=4, action_dim=7, obs_keys=("rgb", "state"))
    make_policy(cfg, {"rgb": (64, 64, 3), "state": (17,)}).save_pretrained(tmp_path)
    with pytest.raises(UserError, match=r"set robot.camera \(the policy reads rgb\)"):
        deploy(DeployConfig(policy=str(tmp_path), **FAST))


class MarksDoneAt:
    """An intervention hook that never acts but marks the task done from its `step`-th call on."""

    def __init__(self, step: int) -> None:
        self.step, self.calls, self.success_marked = step, 0, False

    def __call__(self, observation):
        self.calls += 1
        self.success_marked = self.success_marked or self.calls >= self.step
        return None


def test_recording_labels_frames_the_operator_marked_done(tmp_path):
    cfg = DeployConfig(
        policy="local",
        chunk=ChunkConfig(action_horizon=HORIZON, execute_steps=2),
        safety=FAKE_ROBOT_SAFETY,
        robot=RobotConfig(camera="cam"),
        **{**FAST, "max_steps": 8},
    )
    hook = MarksDoneAt(5)
    loop = ControlLoop(cfg, FakeRobot(), LocalPolicy(FakeRunner(), cfg.keys), str(tmp_path / "rec"), hook)
    for _ in range(2):  # the mark starts cleared in every episode
        stats = loop.run_episode("pick")
        hook.calls = 0
    loop.close()
    assert stats.success
    data = LeRobotDataset(tmp_path / "rec")
    for e in range(2):
        episode = data.episode(e)
        # the mark made during step 5 labels the observations from step 6 on (read before each action)
        assert episode["next.reward"].tolist() == [0.0] * 5 + [1.0] * 3
        assert episode["next.done"].tolist() == [False] * 7 + [True]
