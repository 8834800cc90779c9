"""Observation TensorDict -> feature vector: normalized vectors, CNN image features, task embeddings."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from tensordict import TensorDict
from torch import nn

from embodrl.errors import UserError
from embodrl.obs_keys import IMAGE_KEYS, STATE, VECTOR_KEYS
from embodrl.policies.config import PolicyConfig
from embodrl.policies.modules.cnn import ImageEncoder, random_shift
from embodrl.policies.modules.pretrained_tower import PretrainedTower
from embodrl.policies.normalization import Normalizer


def make_normalizers(cfg: PolicyConfig, obs_shapes: dict[str, tuple[int, ...]]) -> nn.ModuleDict:
    """One Normalizer per observed vector key plus `action`; saved with the checkpoint."""
    norms = {
        key: Normalizer(key, obs_shapes[key][-1], cfg.state_normalization, cfg.state_std_min, cfg.obs_clip)
        for key in VECTOR_KEYS
        if key in cfg.normalized_keys and key in obs_shapes
    }
    norms["action"] = Normalizer("action", cfg.action_dim, cfg.action_normalization, hold_constant=True)
    return nn.ModuleDict(norms)


def add_state_noise(state: torch.Tensor, std: float) -> torch.Tensor:
    """Normalized proprioceptive state plus N(0, std^2) noise (SFT augmentation; std 0: unchanged)."""
    return state + std * torch.randn_like(state) if std > 0 else state


def projection(in_dim: int, out_dim: int) -> nn.Sequential:
    """Feature map [N, C, h, w] -> [N, out_dim]: flatten, linear, LayerNorm (as the scratch CNN ends)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_dim, out_dim), nn.LayerNorm(out_dim))


class ObsEncoder(nn.Module):
    """Encodes `keys` of an observation into features [N, out_dim], checking every key first."""

    def __init__(
        self,
        cfg: PolicyConfig,
        keys: tuple[str, ...],
        obs_shapes: dict[str, tuple[int, ...]],
        normalizers: nn.ModuleDict,
    ) -> None:
        super().__init__()
        missing = [k for k in keys if k not in obs_shapes]
        if missing:
            raise UserError(
                f"the policy reads observation keys {missing} that the env does not provide "
                f"(env keys: {sorted(obs_shapes)}); change policy.obs_keys or the env's obs_mode"
            )
        self.keys, self.shapes, self.image_shift = (
            keys,
            {k: tuple(obs_shapes[k]) for k in keys},
            cfg.image_shift,
        )
        self.state_noise_std = cfg.state_noise_std
        self._normalizers = dict(normalizers.items())  # owned (and saved) by the policy, shared here
        cameras = [k for k in keys if k in IMAGE_KEYS]
        if cfg.vision.pretrained:
            # the pretrained tower's feature map, flattened, projected and normalized by a trained head
            # outside the `vision` group, so policy.lora.vision=frozen leaves the head training
            channels, _ = cfg.vision.geometry()
            self.images = nn.ModuleDict({k: PretrainedTower(cfg.vision, self.shapes[k][0]) for k in cameras})
            cells = {k: cfg.vision.cells(*self.shapes[k][:2]) for k in cameras}
            self.image_heads = nn.ModuleDict(
                {k: projection(channels * cells[k], cfg.image_feature_dim) for k in cameras}
            )
        else:
            self.images = nn.ModuleDict(
                {
                    k: ImageEncoder(self.shapes[k][:2], cfg.cnn_channels, cfg.image_feature_dim)
                    for k in cameras
                }
            )
            self.image_heads = nn.ModuleDict()
        self.task_embedding = (
            nn.Embedding(cfg.num_tasks, cfg.task_embedding_dim) if "task_id" in keys else None
        )
        self.out_dim = sum(
            cfg.image_feature_dim
            if k in IMAGE_KEYS
            else cfg.task_embedding_dim
            if k == "task_id"
            else self.shapes[k][-1]
            for k in keys
        )

    def check(self, obs: TensorDict) -> None:
        """Raise a UserError naming the first missing or mis-shaped key."""
        for key in self.keys:
            if key not in obs.keys():
                raise UserError(
                    f"observation is missing key {key!r} that the policy reads; present keys: "
                    f"{sorted(obs.keys())}"
                )
            if key == "task_id" and obs[key].numel() > 0:
                self._check_task_ids(obs[key])
            shape = tuple(obs[key].shape[1:])
            if shape != self.shapes[key]:
                raise UserError(
                    f"obs[{key!r}] has per-env shape {list(shape)}; this policy was built for "
                    f"{list(self.shapes[key])} (a different env, image size or state layout?)"
                )

    def _check_task_ids(self, task_id: torch.Tensor) -> None:
        num_tasks = self.task_embedding.num_embeddings
        if int(task_id.min()) < 0 or int(task_id.max()) >= num_tasks:
            raise UserError(
                f"obs['task_id'] holds ids outside [0, {num_tasks}); set policy.num_tasks to the env's "
                "number of instructions"
            )

    def forward(
        self, obs: TensorDict, augment: bool = False, image_features: TensorDict | None = None
    ) -> torch.Tensor:
        """Features [N, out_dim]; `augment` applies the random image shift (training only);
        `image_features` (from `frozen_image_features`) stand in for the image encoders' outputs."""
        self.check(obs)
        return self.encode(obs, augment, image_features)

    @property
    def images_frozen(self) -> bool:
        """Whether there are image encoders and none of them trains (policy.lora.vision=frozen, or a
        pretrained tower with fixed weights)."""
        if not len(self.images):  # checked at every act: state policies skip walking the parameters
            return False
        return not any(p.requires_grad for p in self.images.parameters())

    def frozen_image_features(self, obs: TensorDict) -> TensorDict | None:
        """The image encoders' outputs {key: [N, image_feature_dim] or a pretrained tower's [N, C, h, w]}
        when they are frozen, else None. A rollout stores them (in `replay`) so the update reuses them
        instead of running the encoders again: frozen weights give the same features, and the encoders are
        most of an image policy's update."""
        if not self.images_frozen:
            return None
        with torch.no_grad():
            features = {key: encoder(obs[key]) for key, encoder in self.images.items()}
        return TensorDict(features, batch_size=obs.batch_size[:1])

    def encode(
        self,
        obs: TensorDict | Mapping[str, torch.Tensor],
        augment: bool = False,
        image_features: TensorDict | None = None,
    ) -> torch.Tensor:
        """`forward` without the checks: their data-dependent branches cannot be traced (deploy/export.py)."""
        parts = []
        for key in self.keys:
            value = obs[key]
            if key in self.images:
                if image_features is not None:
                    cached = image_features[key]
                    parts.append(self.image_heads[key](cached) if key in self.image_heads else cached)
                    continue
                if augment and self.image_shift > 0:
                    value = random_shift(value, self.image_shift)
                features = self.images[key](value)
                parts.append(self.image_heads[key](features) if key in self.image_heads else features)
            elif key == "task_id":
                parts.append(self.task_embedding(value.long()))
            else:
                normalized = self._normalizers[key](value.float())
                if augment and key == STATE:
                    normalized = add_state_noise(normalized, self.state_noise_std)
                parts.append(normalized)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)  # one part: no copy
