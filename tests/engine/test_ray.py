import pytest
import torch

from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.engine.env_client import StagedEnv
from embodrl.engine.schedules import make_schedule
from tests.engine.helpers import make_policy, pendulum

ray = pytest.importorskip("ray", reason="the ray transport needs `pip install embodrl[ray]`")


@pytest.fixture
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_transport_gives_the_inproc_rollout(local_ray):
    data = {}
    for transport in ("inproc", "ray"):
        cfg = pendulum("engine.schedule=pipelined", "engine.num_stages=2", f"engine.transport={transport}")
        env = StagedEnv(cfg.env, cfg.engine)
        try:
            policy = make_policy(cfg, env, deterministic=True)
            schedule = make_schedule(cfg.engine, env, policy, RolloutBuffer(12, 4), "cpu")
            schedule.push_weights(policy, 0)
            data[transport] = schedule.collect(lambda: torch.arange(4)).buffer.data.clone()
        finally:
            env.close()
    a, b = data["inproc"], data["ray"]
    assert torch.equal(a["obs", "state"], b["obs", "state"]) and torch.equal(a["reward"], b["reward"])
