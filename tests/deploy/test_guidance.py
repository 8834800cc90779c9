"""The guided real-time chunking request extension: checks, a server round trip, a flow checkpoint that
follows it, and the loop that sends it (or refuses a policy that cannot use it)."""

import numpy as np
import pytest
import torch

from embodrl.deploy.client import PolicyClient
from embodrl.deploy.config import ChunkConfig, DeployConfig, RobotConfig, ServerConfig
from embodrl.deploy.guidance import guidance_fields, read_prefix
from embodrl.deploy.inference import LocalPolicy
from embodrl.deploy.loop import ControlLoop
from embodrl.deploy.observations import RequestError
from embodrl.deploy.protocol import packb, unpackb
from embodrl.deploy.runner import GUIDANCE_KEY, CheckpointRunner
from embodrl.deploy.server import PolicyServer
from embodrl.errors import UserError
from embodrl.policies.config import PolicyConfig
from embodrl.policies.normalization import compute_stats
from embodrl.policies.registry import make_policy
from tests.deploy.fakes import ACTION_DIM, HORIZON, FakeRobot, FakeRunner, expected_chunk, request
from tests.deploy.test_loop import FAKE_ROBOT_SAFETY, FAST


class GuidedFakeRunner(FakeRunner):
    """FakeRunner that says it can be guided and records the chunk prefix each observation carried."""

    guided_chunks = True

    def __init__(self) -> None:
        super().__init__()
        self.prefixes: list = []

    def infer_batch(self, observations: list[dict]) -> np.ndarray:
        self.prefixes += [o.get(GUIDANCE_KEY) for o in observations]
        return super().infer_batch(observations)


PREV = np.arange(6, dtype=np.float32).reshape(2, ACTION_DIM) / 10  # two planned actions left


def test_the_prefix_survives_the_wire_and_bad_ones_are_refused():
    wire = unpackb(packb({**request(), **guidance_fields(list(PREV), delay=1)}))
    prefix = read_prefix(wire, HORIZON, ACTION_DIM)
    np.testing.assert_array_equal(prefix.actions, PREV)
    assert prefix.delay == 1
    assert read_prefix(request(), HORIZON, ACTION_DIM) is None
    bad = [
        {"prev_actions": np.zeros((HORIZON + 1, ACTION_DIM), np.float32)},
        {"prev_actions": np.zeros((2, ACTION_DIM + 1), np.float32)},
        {"prev_actions": np.full((2, ACTION_DIM), np.nan, np.float32)},
        {"prev_actions": "left, right"},
        {"prev_actions": PREV, "inference_delay": -1},
        {"prev_actions": PREV, "inference_delay": 1.5},
    ]
    for fields in bad:
        with pytest.raises(RequestError):
            read_prefix({**request(), **fields}, HORIZON, ACTION_DIM)


@pytest.mark.parametrize("runner_cls", [GuidedFakeRunner, FakeRunner], ids=["guided", "unguided"])
def test_a_request_round_trip_with_the_extension_keys(runner_cls):
    runner = runner_cls()
    with PolicyServer(runner, ServerConfig(port=0, request_timeout_s=5.0)) as server:
        with PolicyClient(f"ws://127.0.0.1:{server.port}") as client:
            assert client.metadata["guided_chunks"] is runner.guided_chunks
            reply = client.infer({**request(state=(1.0, 2.0)), **guidance_fields(list(PREV), delay=2)})
            np.testing.assert_allclose(reply["actions"], expected_chunk(np.array([1.0, 2.0])))
            too_long = {**request(), "prev_actions": np.zeros((HORIZON + 1, ACTION_DIM), np.float32)}
            if runner.guided_chunks:
                with pytest.raises(UserError, match="prev_actions"):
                    client.infer(too_long)
            else:  # a server whose policy cannot be guided ignores the keys: an unguided chunk
                client.infer(too_long)
    if runner.guided_chunks:
        (prefix,) = runner.prefixes
        np.testing.assert_array_equal(prefix.actions, PREV)
        assert prefix.delay == 2
    else:
        assert runner.batch_sizes == [1, 1]


def flow_checkpoint(tmp_path):
    torch.manual_seed(0)
    cfg = PolicyConfig(family="flow", chunk_size=HORIZON, action_dim=ACTION_DIM, obs_keys=("state",))
    policy = make_policy(cfg, {"state": (2,)})
    policy.set_normalization({"action": compute_stats(torch.randn(200, ACTION_DIM) * 0.4)})
    policy.save_pretrained(tmp_path / "flow")
    return tmp_path / "flow"


def test_a_flow_checkpoint_continues_the_previous_chunk_through_the_runner(tmp_path):
    runner = CheckpointRunner(flow_checkpoint(tmp_path))
    assert runner.guided_chunks and runner.metadata()["guided_chunks"]
    local = LocalPolicy(runner, ServerConfig().keys)
    prev = np.full((3, ACTION_DIM), 0.6, dtype=np.float32)
    torch.manual_seed(3)
    plain = local.infer(request())
    torch.manual_seed(3)
    guided = local.infer({**request(), **guidance_fields(list(prev), delay=2)})
    assert guided.shape == plain.shape == (HORIZON, ACTION_DIM)
    gap = lambda chunk: np.abs(chunk[:2] - prev[:2]).mean()  # noqa: E731
    assert gap(guided) < 0.3 * gap(plain)


def test_guided_rtc_sends_the_plan_left_and_refuses_a_policy_that_cannot_use_it():
    chunk = ChunkConfig(mode="guided_rtc", action_horizon=HORIZON, execute_steps=3, inference_delay_steps=1)
    cfg = DeployConfig(
        policy="local", chunk=chunk, safety=FAKE_ROBOT_SAFETY, robot=RobotConfig(camera="cam"), **FAST
    )
    with pytest.raises(UserError, match="chunk.mode=rtc"):
        ControlLoop(cfg, FakeRobot(), LocalPolicy(FakeRunner(), cfg.keys))
    runner = GuidedFakeRunner()
    loop = ControlLoop(cfg, FakeRobot(), LocalPolicy(runner, cfg.keys))
    stats = loop.run_episode("pick")
    loop.close()
    assert stats.chunks > 2 and runner.prefixes[0] is None  # the first chunk has nothing to continue
    later = [p for p in runner.prefixes[1:] if p is not None]
    assert len(later) == len(runner.prefixes) - 1
    assert all(p.delay == 1 and 1 <= len(p.actions) <= HORIZON for p in later)
