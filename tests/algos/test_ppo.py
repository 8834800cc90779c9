import pytest
import torch
from torch import nn

from embodrl.algos.ppo import PPO
from embodrl.engine.env_client import StagedEnv
from tests.engine.helpers import make_policy, pendulum


@pytest.mark.parametrize("scale", [1e-3, 1e3])  # below and above the bound
def test_gradient_clipping_equals_torch_clip_grad_norm(scale):
    cfg = pendulum()
    env = StagedEnv(cfg.env, cfg.engine)
    try:
        policy = make_policy(cfg, env)
    finally:
        env.close()
    ppo = PPO(policy, cfg.algo)
    gen = torch.Generator().manual_seed(0)
    params = [p for p in policy.parameters() if p.requires_grad]
    grads = [scale * torch.randn(p.shape, generator=gen) for p in params]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    norm = ppo._clip_gradients(0.5)
    clipped = [p.grad.clone() for p in params]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    expected = nn.utils.clip_grad_norm_(params, 0.5)
    assert norm == pytest.approx(float(expected), rel=1e-6)
    for mine, p in zip(clipped, params, strict=True):
        torch.testing.assert_close(mine, p.grad, rtol=0, atol=0)
