import copy
import itertools

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from embodrl.algos.ppo import PPO
from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.engine.data_parallel import STRATEGIES, DataParallel
from embodrl.engine.env_client import StagedEnv
from embodrl.engine.schedules import make_schedule
from tests.engine.helpers import make_policy, pendulum

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
    env = StagedEnv(cfg.env, cfg.engine)
    try:
        policy = make_policy(cfg, env)
        schedule = make_schedule(cfg.engine, env, policy, RolloutBuffer(10, env.num_envs), "cpu")
        schedule.push_weights(policy, 0)
        buffer = schedule.collect(lambda: torch.arange(4)).buffer  # 40 samples: 5 minibatches of 2 x 4
    finally:
        env.close()
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
