"""The inference worker: the policy that acts in rollouts, with versioned weights.

Colocated with the actor it uses the actor's own policy object (no copy, the version just follows
the updates); otherwise it holds a copy on its own device and applies pushed weights between
decisions (an in-flight update), so a rollout may span several versions, each sample tagged.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from tensordict import TensorDict
from torch import nn
from torch.distributed.fsdp import FSDPModule

from embodrl.engine.timer import StageTimer
from embodrl.policies.base import ActOut


class InferenceWorker:
    """Runs `policy.act` / `policy.value` without autograd and knows which weight version it acts with."""

    def __init__(self, policy: nn.Module, timer: StageTimer, copy_to: str | None = None) -> None:
        self.timer = timer
        self.shared = copy_to is None
        self.policy = policy if self.shared else copy.deepcopy(policy).to(copy_to).eval()
        self.device = next(self.policy.parameters()).device
        # an FSDP-sharded policy all-gathers in every forward: all ranks must run the same forwards
        self.lockstep = isinstance(self.policy, FSDPModule)
        # inference_mode tracks no version counters or views (~5% of a one-env decision); what comes out
        # is copied (buffer, env) or read, never saved for backward. Not under FSDP: the weights it
        # gathers inside would become inference tensors that the update's forward cannot use.
        self._no_grad = torch.no_grad if self.lockstep else torch.inference_mode
        self.version = 0
        self._pending: tuple[dict[str, torch.Tensor], int] | None = None
        self._lock = threading.Lock()
        self._pushed = threading.Condition(self._lock)
        self._acting = threading.Lock()  # held by every act, and by `paused`
        self.latest_version = 0  # newest version pushed, applied or not
        self.closed = False

    def push_weights(self, policy: nn.Module, version: int) -> None:
        """Called by the actor after an update: these weights act from the next decision on."""
        with self._pushed:
            if not self.shared:
                state = {k: v.detach().to(self.device, copy=True) for k, v in policy.state_dict().items()}
                self._pending = (state, version)
            else:
                self.version = version
            self.latest_version = version
            self._pushed.notify_all()

    def wait_for_version(self, version: int) -> bool:
        """Block until weights of version >= `version` were pushed (the staleness bound); False if closed."""
        with self._pushed:
            self._pushed.wait_for(lambda: self.latest_version >= version or self.closed)
            return not self.closed

    def close(self) -> None:
        """Wake every waiter; they give up."""
        with self._pushed:
            self.closed = True
            self._pushed.notify_all()

    def sync(self) -> None:
        """Apply the newest pushed weights, if any (between decisions, never inside one)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            state, version = pending
            with self.timer.stage("weight_sync"):
                self.policy.load_state_dict(state)
            self.version = version

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No `act` runs inside (one under way finishes first): the caller (an evaluation beside an async
        producer) is then alone on torch's RNG and may fork it without replaying the producer's draws."""
        with self._acting:
            yield

    def act(self, obs: TensorDict) -> ActOut:
        with self._no_grad(), self._acting, self.timer.stage("inference"):
            return self.policy.act(self._on_device(obs))

    def value(self, obs: TensorDict) -> torch.Tensor:
        with self._no_grad(), self.timer.stage("inference"):
            return self.policy.value(self._on_device(obs))

    def _on_device(self, obs: TensorDict) -> TensorDict:
        # `to` costs ~8 us even when nothing moves: a tenth of a one-env decision's inference
        return obs if obs.device == self.device else obs.to(self.device)
