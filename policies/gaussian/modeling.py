"""Gaussian MLP/CNN actor-critic: a diagonal Gaussian over normalized action chunks (the PPO baseline).

The mean comes from an MLP on the encoded observation (state vector and/or CNN image features); the
std is a free, state-independent parameter per chunk element. There is no tanh squashing: samples
are un-normalized to env units and the env clips them to its bounds. Log-probs are taken in
normalized units (the constant Jacobian of the affine normalization cancels in PPO ratios).
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict
from torch import nn

from embodrl.errors import UserError
from embodrl.policies.base import ActionProgram, ActOut, EvalOut, Policy
from embodrl.policies.config import PolicyConfig
from embodrl.policies.modules.logprob import reduce_logprob
from embodrl.policies.modules.mlp import mlp
from embodrl.policies.modules.obs_encoder import ObsEncoder
from embodrl.policies.modules.sft import check_action_batch, masked_mean


def orthogonal_init(net: nn.Sequential, output_gain: float) -> None:
    """CleanRL's layer_init on an MLP: orthogonal weights, gain sqrt(2) on hidden layers, `output_gain`
    on the last one; zero biases."""
    linears = [m for m in net if isinstance(m, nn.Linear)]
    for i, layer in enumerate(linears):
        nn.init.orthogonal_(layer.weight, gain=output_gain if i == len(linears) - 1 else math.sqrt(2))
        nn.init.zeros_(layer.bias)


HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class GaussianMeanProgram(ActionProgram):
    """The Gaussian's mean chunk: what `act(deterministic=True)` returns."""

    def __init__(self, policy: GaussianPolicy) -> None:
        super().__init__(policy, policy.encoder)
        self.actor, self.chunk_shape = policy.actor, policy.chunk_shape

    def normalized_actions(self, features: torch.Tensor, extra: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.actor(features).view(-1, *self.chunk_shape)


class GaussianPolicy(Policy):
    """Actor-critic with a Gaussian actor; replay stores the sampled normalized chunk."""

    family = "gaussian"

    def __init__(
        self, cfg: PolicyConfig, obs_shapes: dict[str, tuple[int, ...]], device: str = "cpu"
    ) -> None:
        super().__init__(cfg, obs_shapes)
        self.encoder = ObsEncoder(cfg, cfg.obs_keys, self.obs_shapes, self.normalizers)
        self.value_encoder = self._make_value_encoder()
        gcfg = cfg.gaussian
        self.actor = mlp(self.encoder.out_dim, gcfg.hidden_dims, math.prod(self.chunk_shape), gcfg.activation)
        self.log_std = nn.Parameter(torch.full(self.chunk_shape, math.log(gcfg.init_std)))  # [C, A]
        self.critic = self._make_critic(self.encoder.out_dim)
        if gcfg.init == "orthogonal":
            orthogonal_init(self.actor, output_gain=0.01)
            orthogonal_init(self.critic.net, output_gain=1.0)
        self.aux_head = self._make_aux_head(self.encoder.out_dim)
        self.to(device)

    def _mean_std(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian's mean and std [N, C, A], in normalized units."""
        mean = self.actor(features).view(-1, *self.chunk_shape)
        return mean, self.log_std.exp().expand_as(mean)

    def _log_density(self, action_norm: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """Per-element Gaussian log-density [N, C, A]. Written out, not a torch Normal: building the
        distribution costs more than this math for one env (act) or a small minibatch (evaluate), and one
        formula for both makes the first minibatch's ratio exactly 1."""
        return -0.5 * ((action_norm - mean) / std) ** 2 - self.log_std - HALF_LOG_2PI

    @torch.no_grad()
    def act(self, obs: TensorDict, deterministic: bool = False) -> ActOut:
        image_features = self.encoder.frozen_image_features(obs)
        features = self.encoder(obs, image_features=image_features)
        mean, std = self._mean_std(features)
        action_norm = mean if deterministic else torch.normal(mean, std)  # what Normal.sample draws
        replay = {"action_norm": action_norm}
        if image_features is not None:  # frozen CNNs: the update reads their features from here
            replay["image_features"] = image_features
        return ActOut(
            actions=self.normalizers["action"].unnormalize(action_norm),
            logprob=reduce_logprob(self._log_density(action_norm, mean, std), self.cfg.logprob_type),
            value=self._value(obs, features),
            replay=TensorDict(replay, batch_size=action_norm.shape[:1]),
        )

    def evaluate(self, obs: TensorDict, replay: TensorDict) -> EvalOut:
        if "action_norm" not in replay.keys():
            raise UserError("replay lacks 'action_norm': it was not produced by a gaussian policy's act()")
        features = self.encoder(obs, image_features=replay.get("image_features", None))
        mean, std = self._mean_std(features)
        logprob = self._log_density(replay["action_norm"], mean, std)
        entropy = (0.5 + HALF_LOG_2PI + self.log_std).expand_as(mean)  # a Normal's, per element
        return EvalOut(
            logprob=reduce_logprob(logprob, self.cfg.logprob_type),
            entropy=entropy.mean((-2, -1)),  # [N], mean per action element
            value=self._value(obs, features),
        )

    def value(self, obs: TensorDict) -> torch.Tensor:
        return self._value(obs, self.encoder(obs))

    def action_program(self) -> ActionProgram:
        return GaussianMeanProgram(self)

    def sft_loss(self, batch: TensorDict) -> torch.Tensor:
        """MSE between the Gaussian mean and the normalized demo chunk, ignoring padded steps."""
        target = self.normalizers["action"](check_action_batch(batch, self.chunk_shape))  # [B, C, A]
        features = self.encoder(batch, augment=True)
        mean = self.actor(features).view_as(target)
        return masked_mean((mean - target).pow(2), batch.get("action_is_pad", None)) + self._aux_loss(
            batch, features
        )
