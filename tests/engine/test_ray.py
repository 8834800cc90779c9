import pytest
import torch

from embodrl.engine.env_client import StagedEnv
from tests.engine.helpers import pendulum, pipelined_rollout

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
            data[transport] = pipelined_rollout(env, cfg)[1]
        finally:
            env.close()
    a, b = data["inproc"], data["ray"]
    assert torch.equal(a["obs", "state"], b["obs", "state"]) and torch.equal(a["reward"], b["reward"])
