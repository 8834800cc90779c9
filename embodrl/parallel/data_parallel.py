"""Actor data parallelism with torch.distributed: the gradients are averaged over ranks in backward.

Two ways to split the data (gloo on CPU, NCCL on GPU):
- shared rollout: all ranks hold the same rollout and draw the same minibatch order (same generator
  seed); rank r takes the r-th contiguous share of each minibatch;
- own rollouts (`embodrl train` under torchrun, as rsl-rl multi-GPU): every rank collected its own
  rollout from its own envs and trains on its whole minibatches; the global batch is world x larger.
Two strategies:
- `ddp`: DistributedDataParallel, every rank holds all weights (it broadcasts rank 0's at start);
- `fsdp`: FSDP2 `fully_shard`, every rank holds 1/world of each weight and optimizer state, for
  policies too large to replicate (ranks must start from the same weights: same seed or checkpoint;
  the parameters become DTensors, `full_tensor()` gathers one). Each transformer block (the decoder
  layers of the language model and the action expert, the vision tower's encoder layers) is its own
  FSDP unit, gathered for its forward and freed after it, so a rank never holds more than one block's
  full weights besides the root's own (embeddings, heads). The policy itself is the root unit, and its
  act/value/evaluate are FSDP forward methods (all-gather before, free after), so a sharded policy acts
  in rollouts like an unsharded one, as long as every rank runs the same forwards in the same order.
With a shared rollout and equal shares of valid samples the update equals single-process training
on the whole minibatch. The target-KL early stop uses the mean over ranks and a minibatch is skipped
when any rank's part is empty, so every rank runs the same backward passes (each one all-reduces).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from tensordict import TensorDict
from torch import nn
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
from torch.nn.parallel import DistributedDataParallel

from embodrl.choices import check_choice

STRATEGIES = ("ddp", "fsdp")
# The repeated blocks of transformers and ViTs: LlamaDecoderLayer, GemmaDecoderLayer, SiglipEncoderLayer,
# the action expert's ExpertLayer, timm's Block.
BLOCK_SUFFIXES = ("Layer", "Block")
# The policy methods that read its weights (embodrl.policies.base): each gathers the root's shards.
FORWARD_METHODS = ("act", "value", "evaluate")


def transformer_blocks(module: nn.Module) -> list[nn.Module]:
    """The members of `module`'s nn.ModuleLists whose class name ends in Layer or Block, outermost first."""
    return [
        block
        for blocks in module.modules()
        if isinstance(blocks, nn.ModuleList)
        for block in blocks
        if type(block).__name__.endswith(BLOCK_SUFFIXES)
    ]


class _Evaluate(nn.Module):
    """`policy.evaluate` as a forward, which is what DistributedDataParallel hooks into."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: TensorDict, replay: TensorDict):  # -> EvalOut
        return self.policy.evaluate(obs, replay)


class DataParallel:
    """The current process group's view of one actor: shards minibatches, averages gradients and scalars."""

    def __init__(self, policy: nn.Module, strategy: str = "ddp", shared_rollout: bool = True) -> None:
        check_choice("data parallel strategy", strategy, STRATEGIES)
        self.shared_rollout = shared_rollout
        if not dist.is_initialized():
            raise RuntimeError(
                "call torch.distributed.init_process_group before building a DataParallel actor"
            )
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = device = next(policy.parameters()).device
        self.blocks = transformer_blocks(policy) if strategy == "fsdp" else []  # FSDP units below the root
        if strategy == "fsdp":
            for block in reversed(self.blocks):  # inner units first: fully_shard wraps bottom-up
                fully_shard(block)
            fully_shard(policy)  # the rest of the weights: one unit
            for method in FORWARD_METHODS:
                register_fsdp_forward_method(policy, method)
            self.evaluate = policy.evaluate
            return
        # find_unused_parameters: the critic-only warm-up leaves the actor's parameters without gradients
        self.evaluate = DistributedDataParallel(
            _Evaluate(policy),
            device_ids=[device] if device.type == "cuda" else None,
            find_unused_parameters=True,
        )  # also broadcasts rank 0's weights, so every rank starts equal

    def shard(self, batch: TensorDict) -> TensorDict:
        """This rank's part of a minibatch [B]: a contiguous share (sizes differ by at most one sample) of a
        shared rollout's minibatch, or the whole minibatch of its own rollout."""
        if not self.shared_rollout:
            return batch
        bounds = torch.linspace(0, batch.batch_size[0], self.world_size + 1).round().long().tolist()
        return batch[bounds[self.rank] : bounds[self.rank + 1]]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean of a scalar over ranks."""
        value = value.detach().clone()
        dist.all_reduce(value)
        return value / self.world_size

    def any_empty(self, batch: TensorDict) -> bool:
        """Whether some rank's part of this minibatch is empty (then every rank skips it)."""
        size = torch.tensor(float(batch.batch_size[0]), device=self.device)
        dist.all_reduce(size, op=dist.ReduceOp.MIN)
        return bool(size == 0)
