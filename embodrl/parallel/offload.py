"""`engine.offload`: what one phase of a synchronous schedule leaves idle waits in host memory.

The rollout and the update alternate on one device. During a rollout the actor's optimizer state and
gradients are idle, and so are its weights when a disaggregated inference copy does the acting; during the
update that copy is idle. Moving them to the host frees the device for the other phase (larger rollout
batches, a larger model), at the cost of copying them back and forth once per iteration. Tensors that
already live on the host (a CPU run) stay where they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

HOST = torch.device("cpu")


class PhaseOffload:
    """Context managers around the two phases of an iteration; each restores what it moved, also when the
    phase raises (a failed rollout is retried, and the crash checkpoint reads the actor's state)."""

    def __init__(self, actor: nn.Module, optimizer: torch.optim.Optimizer, inference_copy: nn.Module | None):
        self.actor, self.optimizer, self.inference_copy = actor, optimizer, inference_copy

    @contextmanager
    def rollout_phase(self) -> Iterator[None]:
        for p in self.actor.parameters():  # the next update's zero_grad would drop them anyway
            p.grad = None
        devices = self._move_optimizer_state()
        actor_device = _device_of(self.actor)
        idle_actor = self.inference_copy is not None  # colocated, the actor itself acts
        if idle_actor:
            self.actor.to(HOST)
        try:
            yield
        finally:
            if idle_actor:
                self.actor.to(actor_device)
            self._restore_optimizer_state(devices)

    @contextmanager
    def update_phase(self) -> Iterator[None]:
        if self.inference_copy is None:
            yield
            return
        copy_device = _device_of(self.inference_copy)
        self.inference_copy.to(HOST)
        try:
            yield
        finally:
            self.inference_copy.to(copy_device)

    def _move_optimizer_state(self) -> dict[tuple[int, str], torch.device]:
        """Every state tensor to the host; returns where each was (Adam's `step` may live apart)."""
        devices = {}
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device != HOST:
                    devices[id(param), key] = value.device
                    state[key] = value.to(HOST)
        return devices

    def _restore_optimizer_state(self, devices: dict[tuple[int, str], torch.device]) -> None:
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                device = devices.get((id(param), key))
                if device is not None:
                    state[key] = value.to(device)


def _device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device
