import copy
import itertools
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensordict import TensorDict
from torch.distributed.fsdp import FSDPModule

from embodrl.algos.ppo import PPO
from embodrl.engine.schedules.base import bootstrap_value
from embodrl.errors import ConfigError
from embodrl.parallel.data_parallel import STRATEGIES, DataParallel, transformer_blocks
from tests.engine.helpers import collect_once, pendulum
from tests.policies.test_contract import build, make_obs

WORLD = 2


def _rank_update(rank, store, policy, buffer, algo_cfg, results):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        for strategy in STRATEGIES:
            # spawn hands both ranks the same shared-memory tensors: each rank trains its own copy
            mine, data = copy.deepcopy(policy), copy.deepcopy(buffer)
            algo = PPO(mine, algo_cfg, data_parallel=DataParallel(mine, strategy))
            algo.update(data, 0, torch.Generator().manual_seed(0))
            full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t  # FSDP: gather the shards
            weights = {k: full(p.detach()).clone() for k, p in mine.named_parameters()}
            grads = {k: full(p.grad).clone() for k, p in mine.named_parameters()}
            torch.save({"weights": weights, "grads": grads}, f"{results}/{strategy}{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_rank_ddp_and_fsdp_updates_equal_single_process_training(tmp_path):
    cfg = pendulum("algo.minibatch_size=8", "algo.target_kl=null")
    policy, buffer = collect_once(cfg, 10, lambda: torch.arange(4))  # 40 samples: 5 minibatches of 2 x 4
    start, buffer_copy = copy.deepcopy(policy), copy.deepcopy(buffer)
    PPO(policy, cfg.algo).update(buffer, 0, torch.Generator().manual_seed(0))
    assert bool(buffer.data["mask"].all()), "equal shares of valid samples make the updates equal"

    mp.spawn(_rank_update, args=(tmp_path / "store", start, buffer_copy, cfg.algo, tmp_path), nprocs=WORLD)
    moved = False
    for strategy, rank in itertools.product(STRATEGIES, range(WORLD)):
        got = torch.load(tmp_path / f"{strategy}{rank}.pt")
        for name, param in policy.named_parameters():
            torch.testing.assert_close(got["weights"][name], param.detach(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got["grads"][name], param.grad, rtol=1e-4, atol=1e-6)
            moved |= not torch.equal(param.detach(), start.state_dict()[name])
    assert moved, "the update changed nothing: the test would pass vacuously"


def _vla_loss(evaluate, obs, replay) -> torch.Tensor:
    out = evaluate(obs, replay)
    return -out.logprob.float().mean() + out.value.float().pow(2).mean()


def _rank_fsdp_blocks(rank, store, policy, obs, replay, results):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        data_parallel = DataParallel(policy, "fsdp")
        # fully_shard swaps a block's class for FSDP<class>
        blocks = data_parallel.blocks
        sharded = [type(b).__name__.removeprefix("FSDP") for b in blocks if isinstance(b, FSDPModule)]
        optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
        share = data_parallel.shard(TensorDict({"obs": obs, "replay": replay}, batch_size=obs.batch_size))
        _vla_loss(data_parallel.evaluate, share["obs"], share["replay"]).backward()
        grads = {k: p.grad.full_tensor().clone() for k, p in policy.named_parameters() if p.grad is not None}
        optimizer.step()
        weights = {k: p.detach().full_tensor().clone() for k, p in policy.named_parameters()}
        torch.save({"sharded": sharded, "grads": grads, "weights": weights}, f"{results}/vla{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_fsdp_shards_every_transformer_block_and_matches_single_process_training(tmp_path):
    policy = build("flow-vla-noise", obs_keys=("state", "rgb"))
    obs = make_obs(4)
    replay = policy.act(obs).replay
    start = copy.deepcopy(policy)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)  # Adam would amplify float noise in ~0 grads
    _vla_loss(policy.evaluate, obs, replay).backward()
    optimizer.step()

    mp.spawn(_rank_fsdp_blocks, args=(tmp_path / "store", start, obs, replay, tmp_path), nprocs=WORLD)
    blocks = Counter(type(b).__name__ for b in transformer_blocks(policy))
    assert blocks == {"LlamaDecoderLayer": 4, "ExpertLayer": 4, "SiglipEncoderLayer": 2}, blocks
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"vla{rank}.pt", weights_only=False)
        assert Counter(got["sharded"]) == blocks
        assert got["grads"] and got["grads"].keys() == {
            k for k, p in policy.named_parameters() if p.grad is not None
        }
        for name, param in policy.named_parameters():
            if param.grad is not None:
                torch.testing.assert_close(got["grads"][name], param.grad, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(got["weights"][name], param.detach(), rtol=1e-5, atol=1e-6)


class _CountingInference:
    """An inference worker whose value forward counts its calls (each one would all-gather under FSDP)."""

    def __init__(self, lockstep: bool) -> None:
        self.lockstep, self.calls = lockstep, 0

    def value(self, obs: TensorDict) -> torch.Tensor:
        self.calls += 1
        return torch.full(obs.batch_size, 7.0)


@pytest.mark.parametrize("lockstep", [False, True])
def test_a_sharded_rollout_runs_the_bootstrap_forward_whether_or_not_an_env_truncated(lockstep):
    out = SimpleNamespace(value=torch.zeros(3))
    for truncated, expected in (([False] * 3, [0.0] * 3), ([False, True, False], [0.0, 7.0, 0.0])):
        inference = _CountingInference(lockstep)
        res = SimpleNamespace(
            truncated=torch.tensor(truncated), final_obs=TensorDict({"state": torch.zeros(3, 2)}, [3])
        )
        assert bootstrap_value(inference, out, res).tolist() == expected
        # whether an env truncated differs between ranks; the number of forwards must not
        assert inference.calls == (1 if lockstep or any(truncated) else 0)


@pytest.mark.parametrize("override", ["engine.schedule=async", "engine.placement=disaggregated"])
def test_fsdp_refuses_schedules_whose_forwards_differ_between_ranks(override):
    fsdp = ("engine.data_parallel=fsdp",)
    pendulum(*fsdp, "engine.schedule=pipelined", "engine.num_stages=2")  # lockstep: accepted
    with pytest.raises(ConfigError, match="engine.data_parallel=fsdp needs"):
        pendulum(*fsdp, override)
