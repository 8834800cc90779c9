"""torchrun's process group for data-parallel `embodrl train`: join it, know the rank, combine values.

`torchrun --nproc_per_node=K -m embodrl.cli train ...` starts K processes with WORLD_SIZE, RANK,
LOCAL_RANK and MASTER_ADDR/MASTER_PORT in their environment. Each rank steps its own env.num_envs
envs with rank-dependent seeds, so the ranks collect different rollouts (as rsl-rl multi-GPU does),
and the update averages gradients over ranks; rank 0 alone writes the run folder.
A rank that fails leaves the others waiting in their next collective: torchrun stops them when it sees
the failure; started otherwise, they wait for the process-group timeout (torch.distributed.constants).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist

from embodrl.errors import UserError

T = TypeVar("T")
# Rank r's seeds are seed + r * stride: far above the small offsets one rank uses (seed + 1, ...).
_RANK_SEED_STRIDE = 1_000_003


def launched_by_torchrun() -> bool:
    """Whether this process is one of several that torchrun started (WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_from_env(device: str) -> bool:
    """Join the process group that torchrun describes (WORLD_SIZE > 1): NCCL for CUDA, gloo otherwise.

    Returns False, and does nothing, in a single process; True when the group exists (also when the
    caller initialized it already).
    """
    if dist.is_initialized():
        return True
    if not launched_by_torchrun():
        return False
    target = torch.device(device)
    if target.type == "cuda":
        if target.index is not None:
            raise UserError(f"device={device} under torchrun: set device=cuda (rank r uses cuda:LOCAL_RANK)")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # "cuda" now means this rank's GPU
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return True


def close() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    """Rank 0, or a single process: the one that writes logs, checkpoints, evaluations and videos."""
    return rank() == 0


def from_main(make: Callable[[], T]) -> T:
    """`make()` run on rank 0 only (e.g. creating the run folder), its result handed to every rank."""
    if not dist.is_initialized():
        return make()
    box = [make() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def rank_seed(seed: int) -> int:
    """This rank's seed for streams that must differ between ranks (envs, initial states, sampling)."""
    return seed + _RANK_SEED_STRIDE * rank()


def sum_tensor_over_ranks(x: torch.Tensor) -> torch.Tensor:
    """x summed over ranks, as a new tensor on x's device (NCCL reduces CUDA tensors only)."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    total = x.to(device, copy=True)
    dist.all_reduce(total)
    return total.to(x.device)


def sum_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Each value summed over ranks (every rank passes the same keys); unchanged in a single process."""
    if not dist.is_initialized() or not values:
        return values
    keys = sorted(values)
    totals = sum_tensor_over_ranks(torch.tensor([float(values[k]) for k in keys], dtype=torch.float64))
    return dict(zip(keys, totals.tolist(), strict=True))
