"""The whole state of an FSDP-sharded actor: gathered for evaluation and checkpoints, re-sharded on resume.

Under engine.data_parallel=fsdp every rank holds shards of each weight and optimizer state, and
gathering them is a collective, so every rank joins each gather. Rank 0 then loads the weights
into an unsharded copy, which it evaluates and saves alone, as it does under DDP.

Why a copy on rank 0 rather than evaluating the sharded policy on every rank in lockstep: a sharded
forward all-gathers, so every rank would have to run exactly as many decisions as the others, but an
evaluation plays until its episodes end, and an episode that ends one step later on one rank (float
noise on another GPU is enough) would leave the other ranks waiting in an all-gather. The copy costs
rank 0 the whole weights once more in CPU memory, plus the last gathered optimizer state; an
evaluation moves the weights to its device (inference only: no gradients, no optimizer state).
Meanwhile the other ranks wait in their next collective, as under DDP: an evaluation longer than the
process-group timeout (torch's default) ends the run.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from embodrl.errors import UserError

# Gathering: rank 0 receives every tensor, on CPU; the other ranks get {}.
_FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)
# Loading: every rank passes the whole state (read from the checkpoint) and keeps its own shards.
_FULL_ON_EVERY_RANK = StateDictOptions(full_state_dict=True)
# Adam has no state for a parameter that never had a gradient (the actor during the critic warm-up).
_FULL_OPTIMIZER_ON_EVERY_RANK = StateDictOptions(full_state_dict=True, strict=False)


class UnshardedCopy:
    """Rank 0's unsharded copy of a sharded policy plus the full optimizer state, both of one iteration."""

    def __init__(self, policy: nn.Module) -> None:
        """Call before `policy` is sharded (every rank calls it; only rank 0 keeps a copy)."""
        self.policy = None
        if dist.get_rank() == 0:  # copied on CPU: the device may not fit two whole copies
            device = next(policy.parameters()).device
            self.policy = copy.deepcopy(policy.cpu())
            policy.to(device)
        self.optimizer_state: dict = {}  # keyed by parameter name (torch.distributed.checkpoint's layout)
        self.iteration = -1  # the iteration whose state the copy holds

    def gather(self, sharded: nn.Module, optimizer: torch.optim.Optimizer, iteration: int) -> None:
        """Every rank calls it: rank 0's copy then holds `iteration`'s weights and optimizer."""
        weights = get_model_state_dict(sharded, options=_FULL_ON_RANK0)
        self.optimizer_state = get_optimizer_state_dict(sharded, optimizer, options=_FULL_ON_RANK0)
        if self.policy is not None:
            self.policy.load_state_dict(weights)
        self.iteration = iteration


def load_full_weights(sharded: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Every rank calls it with the same whole weights (a checkpoint's); each keeps its shards."""
    set_model_state_dict(sharded, weights, options=_FULL_ON_EVERY_RANK)


def load_full_optimizer_state(sharded: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Every rank calls it with the same whole optimizer state (as UnshardedCopy gathers it)."""
    if any(isinstance(key, int) for key in state["state"]):  # torch.optim's own layout: by parameter index
        raise UserError(
            "this checkpoint was saved without engine.data_parallel=fsdp: resume it with the setting "
            "it was trained with"
        )
    set_optimizer_state_dict(sharded, optimizer, state, options=_FULL_OPTIMIZER_ON_EVERY_RANK)
    # it first gives every parameter a state (a step at learning rate 0): drop the ones the checkpoint
    # has none for, as the uninterrupted run has none for them either (Adam's bias correction counts steps)
    for name, param in sharded.named_parameters():
        if name not in state["state"]:
            optimizer.state.pop(param, None)
