"""`algo.noise_policy=CHECKPOINT`: noise-space RL (DSRL, Wagenmaker et al. 2025) through an env wrapper.

The trained actor's action is the initial noise x0 [H, D] of a frozen pretrained policy, bounded to
[-algo.noise_bound, algo.noise_bound]; the wrapper runs that policy's deterministic sampler from x0 on the
current observation and executes the resulting chunk in the simulator. The off-policy algorithm then
learns in the noise space unchanged: a chunk is one decision, its rewards summed. Only the actor and the
critics train; the steered policy stays as it was loaded (eval mode, no gradients). The actor's checkpoint
names the policy it steers (`policy.steers`), so `embodrl eval` puts the same wrapper between it and the env.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
from tensordict import TensorDict

from embodrl.config import ExperimentConfig
from embodrl.errors import UserError
from embodrl.policies.base import Policy, no_noise_input
from embodrl.policies.loading import load_policy
from embodrl.policies.normalization import STAT_NAMES
from embodrl.sims.base import ActionSpec, StepResult, VecEnv
from embodrl.sims.wrapped import WrappedEnv


class NoiseActionEnv(WrappedEnv):
    """`env` whose actions are `base`'s initial noise [N, H, D] within [-bound, bound] (module docstring)."""

    def __init__(self, env: VecEnv, base: Policy, bound: float = math.inf) -> None:
        if not base.can_act_from_noise:
            raise no_noise_input(base.family)
        shapes = {k: tuple(spec.shape) for k, spec in env.observation_spec.items()}
        wrong = {k: shapes.get(k) for k in base.cfg.obs_keys if shapes.get(k) != base.obs_shapes[k]}
        if wrong or base.cfg.action_dim != env.action_spec.dim:
            raise UserError(
                f"the steered policy reads {dict((k, base.obs_shapes[k]) for k in wrong)} and acts in "
                f"{base.cfg.action_dim} dims, but the env observes {wrong} and acts in "
                f"{env.action_spec.dim}; set env.* as the policy was trained"
            )
        super().__init__(env)
        self.base, self.bound = base.eval().requires_grad_(False), bound
        self.obs: TensorDict | None = None  # the observation the next noise is decoded on

    @property
    def action_spec(self) -> ActionSpec:
        return ActionSpec(dim=self.base.noise_shape[1], low=-self.bound, high=self.bound)

    @property
    def decoded_shape(self) -> tuple[int, int]:
        """The env action chunk [C, A] that one noise [H, D] decodes to."""
        return self.base.chunk_shape

    def decode(self, obs: TensorDict, noise: torch.Tensor) -> torch.Tensor:
        """The chunks [B, C, A] that noise [B, H, D] (clipped to the bound) decodes to on observations `obs`
        (a replay batch's, say): what `step` would execute."""
        return self.base.act_from_noise(obs, noise.clamp(-self.bound, self.bound))

    def prepare_actor(self, actor: Policy) -> None:
        """Set a new actor's normalization for this space: observations as the steered policy normalizes them
        (a few demos' stats: raw positions differ by centimetres), and its tanh's [-1, 1] onto the bound."""
        stats = {
            key: {name: getattr(norm, name) for name in STAT_NAMES}
            for key, norm in self.base.normalizers.items()
            if key != "action"
        }
        dim = self.action_spec.dim
        actor.set_normalization({**stats, "action": {"q01": [-self.bound] * dim, "q99": [self.bound] * dim}})

    def reset(self, seed: int | None = None, options: dict | None = None) -> TensorDict:
        self.obs = super().reset(seed, options)
        return self.obs

    def reset_to(self, state_ids: torch.Tensor, env_ids: torch.Tensor | None = None) -> TensorDict:
        self.obs = super().reset_to(state_ids, env_ids)
        return self.obs

    def step(self, actions: torch.Tensor) -> StepResult:
        """Decode the noise [N, H, D] into the steered policy's chunk and execute that."""
        if self.obs is None:
            raise UserError("reset the env before its first step: the noise is decoded on the observation")
        noise = self.check_actions(actions)  # [N, H, D], clipped to the bound
        if tuple(noise.shape[1:]) != self.base.noise_shape:
            h, d = self.base.noise_shape
            raise UserError(
                f"noise actions must have shape [N, {h}, {d}] (the steered policy's noise), got "
                f"{list(actions.shape)}"
            )
        result = self.env.step(self.decode(self.obs, noise))
        self.obs = result.obs
        return result


def steer_noise(cfg: ExperimentConfig, env: VecEnv) -> tuple[ExperimentConfig, NoiseActionEnv]:
    """For `algo.noise_policy`: `env` behind the steered policy, and the experiment with an actor for that
    space: it emits the policy's noise shape, its checkpoint names the policy (`policy.steers`), and its
    actions are quantile-normalized (`NoiseActionEnv.prepare_actor` maps them onto the bound)."""
    if cfg.policy.init_from:
        raise UserError(
            "algo.noise_policy trains a new actor in the steered policy's noise space; drop policy.init_from "
            "(to continue a run, use --resume)"
        )
    if cfg.train.eval_envs not in (0, cfg.env.num_envs):
        raise UserError(
            "algo.noise_policy evaluates in the training env (the steered policy wraps it): "
            "drop train.eval_envs"
        )
    path = str(Path(cfg.algo.noise_policy).resolve())
    wrapped = NoiseActionEnv(env, load_policy(path, device=cfg.device), cfg.algo.noise_bound)
    h, d = wrapped.base.noise_shape
    actor = dataclasses.replace(
        cfg.policy, chunk_size=h, action_dim=d, steers=path, action_normalization="quantile"
    )
    return dataclasses.replace(cfg, policy=actor), wrapped


def env_for(policy: Policy, env: VecEnv) -> VecEnv:
    """The env `policy` acts in: `env` itself, or for a noise-space actor `env` behind the policy it steers
    (whose noise the actor bounds itself)."""
    if not policy.cfg.steers:
        return env
    return NoiseActionEnv(env, load_policy(policy.cfg.steers, device=str(policy.device)))
