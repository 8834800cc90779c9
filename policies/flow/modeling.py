"""Flow-matching policy: a velocity MLP (the pi0 action expert at state/small-image scale) and its RL heads.

Training (openpi): t ~ Beta(1.5, 1) * 0.999 + 0.001, x_t = t * noise + (1 - t) * action, and the
net regresses v = noise - action. Sampling integrates K Euler steps from t = 1 (noise) to t = 0 in
normalized action units. The likelihood head (`flow.likelihood`) makes the chain stochastic for RL:
Flow-Noise (flow_noise.py) or Flow-SDE (flow_sde.py). Deterministic `act` runs the plain ODE (no
step noise) from x_0 ~ N(0, I), as in pi0 inference.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict
from torch import nn

from embodrl.errors import UserError
from embodrl.policies.base import ActOut, EvalOut, Policy
from embodrl.policies.checkpoint import CheckpointMixin
from embodrl.policies.config import PolicyConfig
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.flow.flow_noise import FlowNoiseHead
from embodrl.policies.flow.flow_sde import FlowSDEHead
from embodrl.policies.flow.sampling import VelocityFn
from embodrl.policies.modules.logprob import reduce_logprob
from embodrl.policies.modules.mlp import ValueHead, mlp
from embodrl.policies.modules.obs_encoder import ObsEncoder, make_normalizers
from embodrl.policies.modules.sft import check_action_batch, masked_mean, zero_padded_steps
from embodrl.policies.modules.time_features import time_features


class VelocityNet(nn.Module):
    """v(features [N, F], x_t [N, C, A], t [N]) -> [N, C, A]: an MLP on [features, x_t, time features]."""

    def __init__(self, feature_dim: int, chunk_shape: tuple[int, int], cfg: FlowConfig) -> None:
        super().__init__()
        self.chunk_shape, self.num_frequencies = chunk_shape, cfg.num_time_frequencies
        in_dim = feature_dim + math.prod(chunk_shape) + 2 * cfg.num_time_frequencies
        self.net = mlp(in_dim, cfg.hidden_dims, math.prod(chunk_shape), activation="silu")

    def forward(self, features: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        inputs = torch.cat([features, x.flatten(1), time_features(t, self.num_frequencies)], dim=-1)
        return self.net(inputs).view(-1, *self.chunk_shape)


class FlowPolicy(CheckpointMixin, Policy):
    """Flow-matching actor-critic; replay stores the denoising chain (and Flow-SDE's step index)."""

    family = "flow"

    def __init__(
        self, cfg: PolicyConfig, obs_shapes: dict[str, tuple[int, ...]], device: str = "cpu"
    ) -> None:
        super().__init__()
        self.cfg, self.obs_shapes = cfg, dict(obs_shapes)
        self.chunk_shape = (cfg.chunk_size, cfg.action_dim)
        self.normalizers = make_normalizers(cfg, self.obs_shapes)
        self.encoder = ObsEncoder(cfg, cfg.obs_keys, self.obs_shapes, self.normalizers)
        self.value_encoder = (
            ObsEncoder(cfg, cfg.value_obs_keys, self.obs_shapes, self.normalizers)
            if cfg.value_obs_keys
            else None
        )
        self.velocity_net = VelocityNet(self.encoder.out_dim, self.chunk_shape, cfg.flow)
        self.head = (
            FlowNoiseHead(self.encoder.out_dim, self.chunk_shape, cfg.flow)
            if cfg.flow.likelihood == "noise"
            else FlowSDEHead(cfg.flow)
        )
        self.critic = ValueHead((self.value_encoder or self.encoder).out_dim, cfg.value_hidden_dims)
        self.to(device)

    def _velocity(self, features: torch.Tensor) -> VelocityFn:
        return lambda x, t: self.velocity_net(features, x, t)

    def _value(self, obs: TensorDict, features: torch.Tensor) -> torch.Tensor:
        return self.critic(features if self.value_encoder is None else self.value_encoder(obs))

    @torch.no_grad()
    def act(self, obs: TensorDict, deterministic: bool = False) -> ActOut:
        features = self.encoder(obs)
        x0 = torch.randn(features.shape[0], *self.chunk_shape, device=features.device)  # noise at t = 1
        replay, logprob = self.head.sample(self._velocity(features), features, x0, deterministic)
        action_norm = replay["chain"][:, -1]  # [N, C, A]
        return ActOut(
            actions=self.normalizers["action"].unnormalize(action_norm),
            logprob=reduce_logprob(logprob, self.cfg.logprob_type),
            value=self._value(obs, features),
            replay=TensorDict(replay, batch_size=features.shape[:1]),
        )

    def evaluate(self, obs: TensorDict, replay: TensorDict) -> EvalOut:
        if "chain" not in replay.keys():
            raise UserError("replay lacks 'chain': it was not produced by a flow policy's act()")
        features = self.encoder(obs)
        logprob, entropy = self.head.log_prob(self._velocity(features), features, replay)
        return EvalOut(
            logprob=reduce_logprob(logprob, self.cfg.logprob_type),
            entropy=entropy,
            value=self._value(obs, features),
        )

    def value(self, obs: TensorDict) -> torch.Tensor:
        return self._value(obs, self.encoder(obs))

    def sft_loss(self, batch: TensorDict) -> torch.Tensor:
        """Flow-matching MSE between predicted and target velocity, ignoring padded chunk steps."""
        is_pad = batch.get("action_is_pad", None)  # [B, C] bool
        action = self.normalizers["action"](check_action_batch(batch, self.chunk_shape))  # [B, C, A]
        action = zero_padded_steps(action, is_pad)
        repeats = self.cfg.flow.sft_samples_per_obs
        features = self.encoder(batch, augment=True).repeat_interleave(repeats, dim=0)  # [B*R, F]
        action = action.repeat_interleave(repeats, dim=0)
        beta = torch.distributions.Beta(
            torch.tensor(1.5, device=action.device), torch.tensor(1.0, device=action.device)
        )
        t = beta.sample((action.shape[0],)) * 0.999 + 0.001  # [B*R], more mass near t = 1 (noise)
        noise = torch.randn_like(action)
        x_t = t.view(-1, 1, 1) * noise + (1 - t.view(-1, 1, 1)) * action
        error = (self.velocity_net(features, x_t, t) - (noise - action)).pow(2)
        return masked_mean(error, None if is_pad is None else is_pad.repeat_interleave(repeats, dim=0))
