import pytest
import torch
from torch import nn

from embodrl.algos.ppo import PPO
from embodrl.engine.env_client import StagedEnv
from tests.engine.helpers import collect_once, make_policy, pendulum


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


@pytest.mark.parametrize("algo", ["algo.name=ppo", "algo.name=grpo"])
def test_update_reports_the_fraction_of_samples_it_trained_on(algo):
    """GAE trains on every sample; GRPO drops what it cannot score (here the unfinished tails of 20-step
    episodes in a 30-step rollout) and says how much it kept."""
    cfg = pendulum(algo, "algo.group_size=2", "algo.target_kl=null")
    num_envs = cfg.env.num_envs
    policy, buffer = collect_once(cfg, 30, lambda: torch.arange(num_envs) // 2)  # groups of 2 share a state
    metrics = PPO(policy, cfg.algo).update(buffer, 0, torch.Generator().manual_seed(0))
    kept = buffer.data["mask"].float().mean().item()
    assert metrics["valid_fraction"] == pytest.approx(kept)
    assert kept == 1.0 if algo.endswith("ppo") else 0.0 < kept < 1.0
