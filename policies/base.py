"""The Policy contract every family implements (DESIGN.md §3), in the spirit of RLinf's forward_inputs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDict
from torch import nn


@dataclass
class ActOut:
    """Result of `Policy.act` (no grad)."""

    actions: torch.Tensor  # [N, C, A] float32, in env units (un-normalized)
    logprob: torch.Tensor  # [N, ...] granularity given by the policy's logprob_type
    value: torch.Tensor  # [N]
    replay: TensorDict  # [N]: exactly what `evaluate` needs to recompute `logprob`


@dataclass
class EvalOut:
    """Result of `Policy.evaluate` (with grad)."""

    logprob: torch.Tensor  # same shape as ActOut.logprob
    entropy: torch.Tensor  # [N] (or broadcastable to logprob)
    value: torch.Tensor  # [N]


class Policy(nn.Module, ABC):
    """A policy family behind one interface; generic code never branches on the family.

    Observations are TensorDicts [N] with the keys of DESIGN.md §2 (`rgb`, `wrist_rgb`, `state`,
    `task_id`, `privileged`); language policies also read `instruction` (a list of N strings that
    the caller adds from `env.instructions(obs["task_id"])`).
    """

    @abstractmethod
    def act(self, obs: TensorDict, deterministic: bool = False) -> ActOut: ...

    @abstractmethod
    def evaluate(self, obs: TensorDict, replay: TensorDict) -> EvalOut: ...

    @abstractmethod
    def value(self, obs: TensorDict) -> torch.Tensor:
        """V(s) [N], used to bootstrap truncated episodes."""

    def critic_parameters(self) -> list[nn.Parameter]:
        """Parameters trained by the value loss alone (critic learning rate): the modules named
        `critic` and `value_encoder`; everything else is the actor's."""
        return [p for name, p in self.named_parameters() if name.startswith(("critic.", "value_encoder."))]

    @abstractmethod
    def sft_loss(self, batch: TensorDict) -> torch.Tensor:
        """Behaviour-cloning loss on a batch with observation keys and `action` [B, C, A]."""

    @abstractmethod
    def save_pretrained(self, directory: str | Path) -> None:
        """Write config.json + model.safetensors + normalization stats."""

    @classmethod
    @abstractmethod
    def from_pretrained(cls, directory: str | Path, device: str = "cpu") -> Policy: ...
