"""Diffusion policy: an epsilon-prediction MLP over the normalized action chunk, conditioned on observation
features (the shared ObsEncoder, or a readout of the VLA backbone's prefix), sampled with a diffusers
schedule. RL sees the last K' denoising steps as a Gaussian MDP (DPPO, see dppo.py); replay stores
their chain.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict

from embodrl.policies.base import ActOut, EvalOut
from embodrl.policies.config import PolicyConfig
from embodrl.policies.diffusion.dppo import DenoisingMDP
from embodrl.policies.modules.logprob import reduce_logprob
from embodrl.policies.modules.mlp import mlp
from embodrl.policies.modules.obs_encoder import ObsEncoder
from embodrl.policies.modules.sft import check_action_batch, masked_mean, zero_padded_steps
from embodrl.policies.modules.time_features import time_features
from embodrl.policies.vla.prefix import (
    VLAPolicy,
    VLAPrefixEncoder,
    check_replay,
    require_bounded_actions,
)
from embodrl.policies.vla.readout import PrefixReadout


class DiffusionPolicy(VLAPolicy):
    """DDPM/DDIM action head with the DPPO likelihood; replay holds the chain [N, K'+1, C, A]."""

    family = "diffusion"

    def __init__(
        self, cfg: PolicyConfig, obs_shapes: dict[str, tuple[int, ...]], device: str = "cpu"
    ) -> None:
        require_bounded_actions(cfg, self.family)
        super().__init__(cfg, obs_shapes)
        dcfg = cfg.diffusion
        if dcfg.conditioning == "vla":
            self.prefix_encoder, self.encoder = VLAPrefixEncoder(cfg, self.obs_shapes, self.normalizers), None
            self.readout = PrefixReadout(
                dcfg.prefix_readout,
                self.prefix_encoder.hidden_size,
                dcfg.readout_queries,
                dcfg.readout_heads,
                max_positions=cfg.vla_architecture.language.max_positions,
            )
            feature_dim = self.readout.out_dim
        else:
            self.prefix_encoder, self.readout = None, None
            self.encoder = ObsEncoder(cfg, cfg.obs_keys, self.obs_shapes, self.normalizers)
            feature_dim = self.encoder.out_dim
        self.value_encoder = self._make_value_encoder()
        chunk_numel = math.prod(self.chunk_shape)
        self.denoiser = mlp(
            feature_dim + chunk_numel + 2 * dcfg.num_time_frequencies, dcfg.hidden_dims, chunk_numel
        )
        self.critic = self._make_critic(feature_dim)
        self.aux_head = self._make_aux_head(feature_dim)
        self.mdp = DenoisingMDP(dcfg)
        self.to(device)

    def features(
        self, obs: TensorDict, augment: bool = False, image_features: TensorDict | None = None
    ) -> torch.Tensor:
        """Conditioning features [N, F] of an observation batch; `augment`: shift the images at random
        (SFT); `image_features`: a frozen CNN's outputs stored by `act` (MLP conditioning only)."""
        if self.encoder is not None:
            return self.encoder(obs, augment=augment, image_features=image_features)
        return self.readout(*self.prefix_states(obs, augment))

    def prefix_states(self, obs: TensorDict, augment: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The backbone's last hidden states [N, P, H] over the prefix, and its real-token mask [N, P]."""
        prefix = self.prefix_encoder(obs, augment)
        hidden = self.prefix_encoder.backbone(prefix.embeds, prefix.mask.long()).last_hidden_state
        return hidden, prefix.mask

    def _eps_model(self, features: torch.Tensor):
        """eps(x_t [M, C, A], t [M]) for M = a multiple of N, rows env-major (features repeated to match)."""
        time_scale = 1.0 / self.cfg.diffusion.num_train_timesteps

        def eps(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            cond = features.repeat_interleave(x.shape[0] // features.shape[0], dim=0)
            times = time_features(t.float() * time_scale, self.cfg.diffusion.num_time_frequencies)
            return self.denoiser(torch.cat([cond, x.flatten(1), times], dim=-1)).view_as(x)

        return eps

    @property
    def caches_prefix(self) -> bool:
        """policy.cache_frozen_prefix on a frozen VLA prefix: its hidden states go to replay, so the update
        runs the readout and the denoiser alone instead of the towers and the language model again."""
        return self.cfg.cache_frozen_prefix and self.prefix_encoder is not None and self.prefix_encoder.frozen

    @torch.no_grad()
    def act(self, obs: TensorDict, deterministic: bool = False) -> ActOut:
        image_features = self.encoder.frozen_image_features(obs) if self.encoder is not None else None
        if self.caches_prefix:
            hidden, mask = self.prefix_states(obs)
            features = self.readout(hidden, mask)
        else:
            features = self.features(obs, image_features=image_features)
        eps = self._eps_model(features)
        n = features.shape[0]
        chain = self.mdp.sample(
            eps, (n, *self.chunk_shape), features.device, deterministic
        )  # [N, K'+1, C, A]
        logprob, _ = self.mdp.chain_logprob(eps, chain)
        action_norm = chain[:, -1].clamp(-1.0, 1.0)  # the env gets clipped actions; the chain stays exact
        replay = {"chain": chain}
        if image_features is not None:  # frozen CNNs: the update reads their features from here
            replay["image_features"] = image_features
        if self.caches_prefix:
            replay.update(prefix_hidden=hidden, prefix_mask=mask)
        return ActOut(
            actions=self.normalizers["action"].unnormalize(action_norm),
            logprob=reduce_logprob(logprob, self.cfg.logprob_type),
            value=self._value(obs, features),
            replay=TensorDict(replay, batch_size=[n]),
        )

    def evaluate(self, obs: TensorDict, replay: TensorDict) -> EvalOut:
        check_replay(replay, ("chain",), self.family)
        if "prefix_hidden" in replay.keys():
            features = self.readout(replay["prefix_hidden"], replay["prefix_mask"])
        else:
            features = self.features(obs, image_features=replay.get("image_features", None))
        logprob, entropy = self.mdp.chain_logprob(self._eps_model(features), replay["chain"])
        return EvalOut(
            logprob=reduce_logprob(logprob, self.cfg.logprob_type),
            entropy=entropy,
            value=self._value(obs, features),
        )

    def value(self, obs: TensorDict) -> torch.Tensor:
        return self._value(obs, self.features(obs) if self.value_encoder is None else None)

    def sft_loss(self, batch: TensorDict) -> torch.Tensor:
        """Noise-prediction MSE on the normalized demo chunk, ignoring padded steps, over
        `diffusion.sft_samples_per_obs` (noise, timestep) draws per frame."""
        is_pad = batch.get("action_is_pad", None)  # [B, C] bool
        target = self.normalizers["action"](check_action_batch(batch, self.chunk_shape)).clamp(-1.0, 1.0)
        target = zero_padded_steps(target, is_pad)  # the denoiser reads the whole noisy chunk
        features = self.features(batch, augment=True)
        repeats = self.cfg.diffusion.sft_samples_per_obs
        terms = self.mdp.sft_loss_terms(target.repeat_interleave(repeats, dim=0), self._eps_model(features))
        pad = None if is_pad is None else is_pad.repeat_interleave(repeats, dim=0)
        return masked_mean(terms, pad) + self._aux_loss(batch, features)
