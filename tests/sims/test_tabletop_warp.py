import importlib.util
import sys
import types

import numpy as np
import pytest
import torch

from embodrl.errors import ConfigError, UserError
from embodrl.sims.config import EnvConfig
from embodrl.sims.registry import make_env
from embodrl.sims.tabletop import physics_warp


def test_physics_backend_is_validated():
    assert EnvConfig().physics_backend == "mujoco"
    with pytest.raises(ConfigError, match="physics_backend='bullet'.*mujoco, warp, warp-cpu"):
        EnvConfig(physics_backend="bullet")
    with pytest.raises(ConfigError, match="tabletop suites only"):
        EnvConfig(suite="gym", gym_id="CartPole-v1", physics_backend="warp")


def test_warp_backend_without_cuda_says_what_to_use(monkeypatch):
    no_gpu = types.SimpleNamespace(init=lambda: None, is_cuda_available=lambda: False)
    monkeypatch.setattr(physics_warp, "_import_warp", lambda: (no_gpu, None))
    with pytest.raises(UserError, match="CUDA GPU.*physics_backend=mujoco.*warp-cpu"):
        make_env(EnvConfig(num_envs=1, physics_backend="warp"))


def test_warp_backend_without_the_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mujoco_warp", None)  # makes `import mujoco_warp` fail
    with pytest.raises(UserError, match=r"pip install -e '\.\[warp\]'"):
        make_env(EnvConfig(num_envs=1, physics_backend="warp-cpu"))


@pytest.mark.skipif(importlib.util.find_spec("mujoco_warp") is None, reason="mujoco-warp not installed")
def test_warp_trajectory_matches_c_mujoco():
    import warp

    warp.init()
    backend = "warp" if warp.is_cuda_available() else "warp-cpu"  # warp's CPU device where there is no GPU
    envs = [make_env(EnvConfig(num_envs=3, task="pick", physics_backend=b)) for b in ("mujoco", backend)]
    c_path, warp_path = envs
    first = [env.reset_to(torch.tensor([4, 17, 4])) for env in envs]
    assert torch.allclose(first[0]["privileged"], first[1]["privileged"], atol=1e-5)
    successes, images = 0, []
    for t in range(30):  # the expert reaches, grasps and lifts the cube: contacts matter
        actions = c_path.expert_actions()[:, None]  # the same actions to both
        results = [env.step(actions) for env in envs]
        for key in ("state", "privileged"):
            # MuJoCo Warp computes in float32: measured max difference 5e-4 over this sequence
            assert torch.allclose(results[0].obs[key], results[1].obs[key], atol=3e-3), key
        assert torch.equal(results[0].success, results[1].success)
        successes += int(results[0].success.sum())
        if t == 20:  # mid-grasp; EGL/OSMesa renders the state copied back from Warp
            images = [env.render(torch.tensor([1])).float() for env in envs]
    assert successes > 0
    assert np.abs(c_path.physics.qpos - warp_path.physics.qpos).max() < 3e-3
    assert (images[0] - images[1]).abs().mean() < 1.0
