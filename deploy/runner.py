"""What the server and the local loop run: a batch of observations in, a batch of action chunks out.

A runner speaks embodrl observation keys (`rgb`, `wrist_rgb`, `state`, `task_id`, `instruction`);
the server maps request keys onto them first. `CheckpointRunner` wraps any embodrl policy; tests
use small fakes of `PolicyRunner`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodrl.errors import UserError
from embodrl.obs_keys import key_dtype

GUIDANCE_KEY = "guidance"  # an observation's chunk prefix (deploy/guidance.py), not a request or policy key


@dataclass(frozen=True)
class InputSpec:
    """One observation input: its per-sample shape and dtype ("str" for text); optional ones may be absent."""

    shape: tuple[int, ...]
    dtype: str
    optional: bool = False


class PolicyRunner(ABC):
    """Batched chunk inference behind the server and the local control loop."""

    action_horizon: int  # H
    action_dim: int  # A
    input_spec: dict[str, InputSpec]
    # whether an observation's GUIDANCE_KEY entry (deploy/guidance.py's ChunkPrefix) steers its chunk
    guided_chunks: bool = False

    @property
    def dataset_features(self) -> dict[str, str]:
        """Obs key -> dataset feature, for a policy trained from a dataset alone (empty otherwise)."""
        return {}

    @abstractmethod
    def infer_batch(self, observations: list[dict[str, Any]]) -> np.ndarray:
        """Action chunks [N, H, A] float32 (robot units) for N observations matching `input_spec`."""

    def metadata(self) -> dict[str, Any]:
        """What the server sends each client on connect (msgpack-able)."""
        return {
            "action_horizon": self.action_horizon,
            "action_dim": self.action_dim,
            "guided_chunks": self.guided_chunks,
            "inputs": {k: {"shape": list(s.shape), "dtype": s.dtype} for k, s in self.input_spec.items()},
            "dataset_features": dict(self.dataset_features),
        }


class ModelRunner(PolicyRunner):
    """An embodrl policy object, run deterministically (its mean/greedy action chunk) or sampling."""

    def __init__(self, policy: Any, deterministic: bool = True) -> None:
        self.policy, self.deterministic = policy, deterministic
        cfg, device = policy.cfg, policy.device
        if "privileged" in cfg.obs_keys:
            raise UserError(
                f"the policy reads privileged simulator state (policy.obs_keys={list(cfg.obs_keys)}); "
                "a robot cannot provide it: train the deployed policy on rgb/wrist_rgb/state only"
            )
        self.action_horizon, self.action_dim, self.device = cfg.chunk_size, cfg.action_dim, device
        self.input_spec = {"instruction": InputSpec((), "str", optional=True)}
        for key in cfg.obs_keys:
            shape = tuple(self.policy.obs_shapes.get(key, ()))
            self.input_spec[key] = InputSpec(shape, key_dtype(key))
        self.family = self.policy.family
        self.guided_chunks = self.policy.can_guide_chunks

    @property
    def dataset_features(self) -> dict[str, str]:
        return dict(self.policy.cfg.dataset_features)

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "family": self.family}

    def infer_batch(self, observations: list[dict[str, Any]]) -> np.ndarray:
        import torch
        from tensordict import TensorDict

        n = len(observations)
        tensors = {
            key: torch.from_numpy(np.stack([np.asarray(o[key]) for o in observations])).to(self.device)
            for key, spec in self.input_spec.items()
            if spec.dtype != "str"
        }
        obs = TensorDict(tensors, batch_size=[n], device=self.device)
        if all("instruction" in o for o in observations):
            obs["instruction"] = [o["instruction"] for o in observations]
        prefixes = [o.get(GUIDANCE_KEY) for o in observations]
        if any(prefix is not None for prefix in prefixes):
            with torch.no_grad():  # guidance differentiates the velocity: no inference-mode tensors
                actions = self.policy.act_guided(obs, self._chunk_guidance(prefixes))
        else:
            with torch.inference_mode():
                actions = self.policy.act(obs, deterministic=self.deterministic).actions  # [N, H, A]
        return actions.float().cpu().numpy()

    def _chunk_guidance(self, prefixes: list):
        """Each observation's chunk prefix (or none: overlap 0) as the policy's ChunkGuidance."""
        import torch

        from embodrl.policies.base import ChunkGuidance

        n = len(prefixes)
        prev = torch.zeros(n, self.action_horizon, self.action_dim)
        overlap, delay = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
        for i, prefix in enumerate(prefixes):
            if prefix is not None:
                prev[i, : len(prefix.actions)] = torch.from_numpy(prefix.actions)
                overlap[i], delay[i] = len(prefix.actions), prefix.delay
        return ChunkGuidance(prev.to(self.device), overlap, delay)


class CheckpointRunner(ModelRunner):
    """An embodrl policy checkpoint, run deterministically."""

    def __init__(self, directory: str | Path, device: str = "cpu") -> None:
        from embodrl.policies.loading import load_policy

        policy = load_policy(directory, device=device).eval()
        if policy.cfg.steers:
            raise UserError(
                f"{directory} picks the initial noise of {policy.cfg.steers} (noise-space RL), which serving "
                "does not decode yet; evaluate it with `embodrl eval`"
            )
        super().__init__(policy)
