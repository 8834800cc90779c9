"""The success classifier: frozen pretrained image features (+ proprioception) -> the logit of "task done".
A progress model is the same network whose output is the episode's progress in [0, 1] (`kind`).

The image tower (EfficientNet-Lite0's first blocks, ImageNet weights from an installed package) never
trains, so training caches its features once per frame and the checkpoint holds only the head: a 1x1
projection of each camera's feature map, flattened, beside the normalized state, into an MLP.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tensordict import TensorDict
from torch import nn

from embodrl.errors import UserError
from embodrl.obs_keys import IMAGE_KEYS, STATE
from embodrl.policies.modules.pretrained_tower import PretrainedTower
from embodrl.policies.vision_config import VisionConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
KIND = "success_classifier"
PROGRESS_KIND = "progress"


@dataclass(frozen=True)
class ClassifierSpec:
    """What a checkpoint's config.json says: the inputs and their shapes, the tower, the head's sizes."""

    obs_keys: tuple[str, ...]
    shapes: dict[str, tuple[int, ...]]
    tower: str
    blocks: int
    channels: int
    hidden: int
    threshold: float
    kind: str = KIND  # KIND, or PROGRESS_KIND

    @property
    def cameras(self) -> tuple[str, ...]:
        return tuple(k for k in self.obs_keys if k in IMAGE_KEYS)

    def vision(self) -> VisionConfig:
        return VisionConfig(tower=self.tower, blocks=self.blocks, train_tower=False)


class ClassifierHead(nn.Module):
    """Tower feature maps {camera: [N, C, h, w]} and the state [N, S] -> success logits [N]."""

    def __init__(self, spec: ClassifierSpec) -> None:
        super().__init__()
        vision = spec.vision()
        channels, _ = vision.geometry()
        self.cameras = spec.cameras
        self.project = nn.ModuleDict({k: nn.Conv2d(channels, spec.channels, 1) for k in self.cameras})
        width = sum(spec.channels * vision.cells(*spec.shapes[k][:2]) for k in self.cameras)
        self.state_dim = spec.shapes[STATE][0] if STATE in spec.obs_keys else 0
        # the state's normalization: from the training frames, saved with the weights
        self.register_buffer("state_mean", torch.zeros(self.state_dim))
        self.register_buffer("state_std", torch.ones(self.state_dim))
        self.mlp = nn.Sequential(
            nn.Linear(width + self.state_dim, spec.hidden),
            nn.ReLU(),
            nn.Linear(spec.hidden, spec.hidden),
            nn.ReLU(),
            nn.Linear(spec.hidden, 1),
        )

    def forward(self, features: dict[str, torch.Tensor], state: torch.Tensor | None) -> torch.Tensor:
        parts = [torch.relu(self.project[k](features[k])).flatten(1) for k in self.cameras]
        if self.state_dim:
            parts.append((state.float() - self.state_mean) / self.state_std)
        return self.mlp(torch.cat(parts, -1)).squeeze(-1)


class SuccessClassifier(nn.Module):
    """Observations (uint8 cameras [N, H, W, 3], state [N, S]) -> probability that the task is done [N]."""

    def __init__(self, spec: ClassifierSpec, device: str | torch.device = "cpu") -> None:
        super().__init__()
        self.spec = spec
        sizes = {spec.shapes[k][0] for k in spec.cameras}
        if len(sizes) != 1 or any(spec.shapes[k][0] != spec.shapes[k][1] for k in spec.cameras):
            raise UserError(f"the classifier's cameras must be square and of one size, got {spec.shapes}")
        self.tower = PretrainedTower(spec.vision(), sizes.pop())
        self.head = ClassifierHead(spec)
        self.to(device)
        self.device = torch.device(device)

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        """The frozen tower's feature map of uint8 images [N, H, W, 3]."""
        return self.tower(images.to(self.device))

    @torch.no_grad()
    def probability(self, obs: TensorDict) -> torch.Tensor:
        """P(success) [N] of observations holding the spec's keys."""
        missing = [k for k in self.spec.obs_keys if k not in obs.keys()]
        if missing:
            raise UserError(f"the success classifier reads {missing}, which the observations lack")
        features = {k: self.features(obs[k]) for k in self.spec.cameras}
        state = obs[STATE].to(self.device) if STATE in self.spec.obs_keys else None
        self.head.eval()
        return torch.sigmoid(self.head(features, state))

    def save(self, directory: str | Path, extra: dict | None = None) -> Path:
        """config.json (the spec, plus `extra`) and model.safetensors (the head; the tower comes from its
        package)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        spec = asdict(self.spec) | {"shapes": {k: list(v) for k, v in self.spec.shapes.items()}}
        (directory / CONFIG_FILE).write_text(json.dumps({**spec, **(extra or {})}, indent=2))
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()},
            directory / WEIGHTS_FILE,
        )
        return directory


def load_classifier(directory: str | Path, device: str | torch.device = "cpu") -> SuccessClassifier:
    """A classifier folder written by `embodrl reward train`; anything else is a one-line UserError."""
    directory = Path(directory)
    config, weights = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not config.is_file() or not weights.is_file():
        raise UserError(
            f"{directory} is not a reward model: it needs {CONFIG_FILE} and {WEIGHTS_FILE} "
            "(a folder written by `embodrl reward train`)"
        )
    try:
        data = json.loads(config.read_text())
    except json.JSONDecodeError as error:
        raise UserError(f"{config} is not valid JSON: {error}") from None
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind != KIND:
        raise UserError(
            f"{directory} is not a success classifier (config.json kind={kind!r}); a reward model's success "
            "comes from `embodrl reward train` with model=classifier"
        )
    try:
        spec = ClassifierSpec(
            obs_keys=tuple(data["obs_keys"]),
            shapes={k: tuple(v) for k, v in data["shapes"].items()},
            **{k: data[k] for k in ("tower", "blocks", "channels", "hidden", "threshold")},
        )
        model = SuccessClassifier(spec, device)
        model.head.load_state_dict(load_file(weights, device=str(model.device)))  # tensors only: no pickle
    except (KeyError, TypeError, ValueError, RuntimeError, SafetensorError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UserError(f"{directory} holds a broken reward model: {first}") from None
    return model
