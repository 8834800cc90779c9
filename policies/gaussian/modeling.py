"""Gaussian MLP/CNN actor-critic: a diagonal Gaussian over normalized action chunks (the PPO baseline).

The mean comes from an MLP on the encoded observation (state vector and/or CNN image features); the
std is a free, state-independent parameter per chunk element. There is no tanh squashing: samples
are un-normalized to env units and the env clips them to its bounds. Log-probs are taken in
normalized units (the constant Jacobian of the affine normalization cancels in PPO ratios).

With `gaussian.squash=tanh` it is SAC's actor instead: the MLP also gives a state-dependent log-std
(bounded to [LOG_STD_MIN, LOG_STD_MAX]), a sample u is squashed to tanh(u) in [-1, 1], and the log-prob
carries tanh's Jacobian. `replay` then keeps u, so `evaluate` recomputes the log-prob exactly.
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
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # squash=tanh: the state-dependent log-std's range (RLPD, CleanRL)


def log_tanh_jacobian(raw: torch.Tensor) -> torch.Tensor:
    """log(1 - tanh(raw)^2) per element, in the form that stays finite for large |raw|."""
    return 2 * (math.log(2) - raw - nn.functional.softplus(-2 * raw))


def mean_chunk(actor_out: torch.Tensor, chunk_shape: tuple[int, int], squash: bool) -> torch.Tensor:
    """The deterministic chunk [N, C, A] (normalized units) from the actor MLP's output: the mean, squashed
    by tanh under squash=tanh (whose output also holds the log-std, after the mean)."""
    mean = actor_out[:, : math.prod(chunk_shape)].view(-1, *chunk_shape)
    return mean.tanh() if squash else mean


class GaussianMeanProgram(ActionProgram):
    """The Gaussian's mean chunk: what `act(deterministic=True)` returns."""

    def __init__(self, policy: GaussianPolicy) -> None:
        super().__init__(policy, policy.encoder)
        self.actor, self.chunk_shape, self.squash = policy.actor, policy.chunk_shape, policy.squash

    def normalized_actions(self, features: torch.Tensor, extra: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return mean_chunk(self.actor(features), self.chunk_shape, self.squash)


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
        self.squash = gcfg.squash == "tanh"
        outputs = math.prod(self.chunk_shape) * (2 if self.squash else 1)  # tanh: mean and log-std
        self.actor = mlp(self.encoder.out_dim, gcfg.hidden_dims, outputs, gcfg.activation)
        if not self.squash:  # a free log-std [C, A]; under tanh the actor gives it per state
            self.log_std = nn.Parameter(torch.full(self.chunk_shape, math.log(gcfg.init_std)))
        self.critic = self._make_critic(self.encoder.out_dim)
        if gcfg.init == "orthogonal":
            orthogonal_init(self.actor, output_gain=0.01)
            orthogonal_init(self.critic.net, output_gain=1.0)
        self.aux_head = self._make_aux_head(self.encoder.out_dim)
        self.to(device)

    def _mean_log_std(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian's mean and log-std [N, C, A], in normalized units (before tanh under squash)."""
        out = self.actor(features)
        if not self.squash:
            mean = out.view(-1, *self.chunk_shape)
            return mean, self.log_std.expand_as(mean)
        mean, log_std = out.view(-1, 2, *self.chunk_shape).unbind(1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def _log_density(self, sample: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        """Per-element log-density [N, C, A] of the Gaussian's `sample` (of tanh(sample) under squash).
        Written out, not a torch Normal: building the distribution costs more than this math for one env
        (act) or a small minibatch (evaluate), and one formula for both makes the first minibatch's ratio
        exactly 1."""
        density = -0.5 * ((sample - mean) / log_std.exp()) ** 2 - log_std - HALF_LOG_2PI
        return density - log_tanh_jacobian(sample) if self.squash else density

    def _squashed(self, sample: torch.Tensor) -> torch.Tensor:
        """The Gaussian's sample as a normalized action."""
        return sample.tanh() if self.squash else sample

    @torch.no_grad()
    def act(self, obs: TensorDict, deterministic: bool = False) -> ActOut:
        image_features = self.encoder.frozen_image_features(obs)
        features = self.encoder(obs, image_features=image_features)
        mean, log_std = self._mean_log_std(features)
        # what Normal.sample draws; replay's `action_norm` is this sample (before tanh under squash)
        sample = mean if deterministic else torch.normal(mean, log_std.exp())
        replay = {"action_norm": sample}
        if image_features is not None:  # frozen CNNs: the update reads their features from here
            replay["image_features"] = image_features
        return ActOut(
            actions=self.normalizers["action"].unnormalize(self._squashed(sample)),
            logprob=reduce_logprob(self._log_density(sample, mean, log_std), self.cfg.logprob_type),
            value=self._value(obs, features),
            replay=TensorDict(replay, batch_size=sample.shape[:1]),
        )

    @property
    def can_sample_reparameterized(self) -> bool:
        return self.squash

    def frozen_features(self, obs: TensorDict) -> TensorDict | None:
        return self.encoder.frozen_image_features(obs)

    def sample_reparameterized(
        self, obs: TensorDict, image_features: TensorDict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.squash:
            raise UserError(
                "an off-policy actor needs bounded actions with a tractable density: set "
                "policy.gaussian.squash=tanh"
            )
        # cached features: the cameras' entries hold them too, which the shape checks would refuse
        features = (
            self.encoder(obs) if image_features is None else self.encoder.encode(obs, False, image_features)
        )
        mean, log_std = self._mean_log_std(features)
        sample = mean + log_std.exp() * torch.randn_like(mean)
        logprob = self._log_density(sample, mean, log_std).sum((-2, -1))
        return self.normalizers["action"].unnormalize(sample.tanh()), logprob

    def evaluate(self, obs: TensorDict, replay: TensorDict) -> EvalOut:
        if "action_norm" not in replay.keys():
            raise UserError("replay lacks 'action_norm': it was not produced by a gaussian policy's act()")
        features = self.encoder(obs, image_features=replay.get("image_features", None))
        mean, log_std = self._mean_log_std(features)
        sample = replay["action_norm"]
        logprob = self._log_density(sample, mean, log_std)
        entropy = 0.5 + HALF_LOG_2PI + log_std  # a Normal's, per element
        if self.squash:  # tanh's: the Normal's plus E[log(1 - tanh(u)^2)], estimated at the sample
            entropy = entropy + log_tanh_jacobian(sample)
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
        """MSE between the deterministic chunk (the mean, squashed under tanh) and the normalized demo
        chunk, ignoring padded steps."""
        target = self.normalizers["action"](check_action_batch(batch, self.chunk_shape))  # [B, C, A]
        features = self.encoder(batch, augment=True)
        mean = mean_chunk(self.actor(features), self.chunk_shape, self.squash)
        return masked_mean((mean - target).pow(2), batch.get("action_is_pad", None)) + self._aux_loss(
            batch, features
        )
