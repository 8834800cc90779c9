"""Actor data parallelism with torch.distributed: every rank trains on its share of each minibatch.

All ranks hold the same rollout and draw the same minibatch order (same generator seed); rank r
takes the r-th contiguous share of each minibatch, and the gradients are averaged over ranks
during backward (gloo on CPU, NCCL on GPU):
- `ddp`: DistributedDataParallel, every rank holds all weights (it broadcasts rank 0's at start);
- `fsdp`: FSDP2 `fully_shard`, every rank holds 1/world of each weight and optimizer state, for
  policies too large to replicate (ranks must start from the same weights: same seed or checkpoint;
  the parameters become DTensors, `full_tensor()` gathers one).
With equal shares of valid samples the update equals single-process training on the whole
minibatch; the target-KL early stop uses the mean over ranks so every rank stops together.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from embodrl.choices import check_choice

STRATEGIES = ("ddp", "fsdp")


class _Evaluate(nn.Module):
    """`policy.evaluate` as a forward, which is what DistributedDataParallel hooks into."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: TensorDict, replay: TensorDict):  # -> EvalOut
        return self.policy.evaluate(obs, replay)


class DataParallel:
    """The current process group's view of one actor: shards minibatches, averages gradients and scalars."""

    def __init__(self, policy: nn.Module, strategy: str = "ddp") -> None:
        check_choice("data parallel strategy", strategy, STRATEGIES)
        if not dist.is_initialized():
            raise RuntimeError(
                "call torch.distributed.init_process_group before building a DataParallel actor"
            )
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        device = next(policy.parameters()).device
        if strategy == "fsdp":
            self.evaluate = fully_shard(_Evaluate(policy))  # one group: every weight gathered per forward
            return
        # find_unused_parameters: the critic-only warm-up leaves the actor's parameters without gradients
        self.evaluate = DistributedDataParallel(
            _Evaluate(policy),
            device_ids=[device] if device.type == "cuda" else None,
            find_unused_parameters=True,
        )  # also broadcasts rank 0's weights, so every rank starts equal

    def shard(self, batch: TensorDict) -> TensorDict:
        """This rank's contiguous share of a minibatch [B] (shares differ by at most one sample)."""
        bounds = torch.linspace(0, batch.batch_size[0], self.world_size + 1).round().long().tolist()
        return batch[bounds[self.rank] : bounds[self.rank + 1]]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a scalar over ranks."""
        value = value.detach().clone()
        dist.all_reduce(value)
        return value / self.world_size
