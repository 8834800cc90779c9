"""engine.offload: the idle state waits on the host during the other phase, and training is unchanged."""

import pytest
import torch
from torch import nn

from embodrl.config import make_run_dir
from embodrl.engine.config import EngineConfig
from embodrl.errors import ConfigError
from embodrl.parallel.offload import PhaseOffload
from embodrl.train.rl_runner import OnPolicyRunner
from tests.pendulum import pendulum

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _trained(device: str = "cpu") -> tuple[nn.Module, torch.optim.Optimizer]:
    """A small net after two Adam steps, so its optimizer holds state (and its params hold grads)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(2):
        optimizer.zero_grad()
        net(torch.randn(16, 4, device=device)).square().mean().backward()
        optimizer.step()
    return net, optimizer


def _state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v.clone() for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def test_the_rollout_phase_drops_grads_and_restores_the_optimizer_state_also_on_error():
    net, optimizer = _trained()
    before = _state(optimizer)
    offload = PhaseOffload(net, optimizer, inference_copy=None)
    with pytest.raises(RuntimeError, match="env died"), offload.rollout_phase():
        assert all(p.grad is None for p in net.parameters())
        raise RuntimeError("env died")
    after = _state(optimizer)
    assert len(after) == len(before) == 3 * 4  # step, exp_avg, exp_avg_sq per parameter
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


@pytest.mark.parametrize("placement", ["colocated", "disaggregated"])
def test_training_with_offload_equals_training_without(tmp_path, placement):
    weights = []
    for offload in (False, True):
        cfg = pendulum(
            "train.iterations=3",
            "train.eval_every=0",
            "train.eval_episodes=2",
            "train.videos=0",
            f"engine.placement={placement}",
            f"engine.offload={str(offload).lower()}",
            f"run_root={tmp_path / str(offload)}",
        )
        runner = OnPolicyRunner(cfg, make_run_dir(cfg))
        runner.learn()
        weights.append(runner.policy.state_dict())
    for key, value in weights[0].items():
        assert torch.equal(value, weights[1][key]), key


def test_offload_is_refused_where_nothing_waits_idle():
    with pytest.raises(ConfigError, match="async rollouts run during the updates"):
        EngineConfig(schedule="async", offload=True)
    with pytest.raises(ConfigError, match="fsdp"):
        EngineConfig(data_parallel="fsdp", offload=True)


@CUDA
def test_on_cuda_the_idle_state_waits_on_the_host():
    net, optimizer = _trained("cuda")
    copy = nn.Linear(4, 2).cuda()
    offload = PhaseOffload(net, optimizer, inference_copy=copy)
    with offload.rollout_phase():
        assert {v.device.type for s in optimizer.state.values() for v in s.values()} == {"cpu"}
        assert all(p.device.type == "cpu" for p in net.parameters())
        assert all(p.device.type == "cuda" for p in copy.parameters())
    assert all(p.device.type == "cuda" for p in net.parameters())
    assert {v.device.type for s in optimizer.state.values() for v in s.values() if v.dim() > 0} == {"cuda"}
    with offload.update_phase():
        assert all(p.device.type == "cpu" for p in copy.parameters())
        optimizer.zero_grad()
        net(torch.randn(16, 4, device="cuda")).square().mean().backward()
        optimizer.step()  # the state is back beside the weights
    assert all(p.device.type == "cuda" for p in copy.parameters())
