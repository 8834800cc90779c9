"""Small image encoder for 64-128 px cameras (the prototype's 4 stride-2 convs) and its augmentation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ImageEncoder(nn.Module):
    """uint8 images [N, H, W, 3] -> features [N, out_dim]: stride-2 3x3 convs, linear, LayerNorm."""

    def __init__(self, image_size: tuple[int, int], channels: tuple[int, ...], out_dim: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 3
        for ch in channels:
            layers += [nn.Conv2d(in_ch, ch, kernel_size=3, stride=2, padding=1), nn.ReLU()]
            in_ch = ch
        self.convs = nn.Sequential(*layers)
        h, w = image_size
        for _ in channels:  # each stride-2 conv with padding 1 maps n -> ceil(n / 2)
            h, w = (h + 1) // 2, (w + 1) // 2
        self.proj = nn.Sequential(nn.Flatten(), nn.Linear(in_ch * h * w, out_dim), nn.LayerNorm(out_dim))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.permute(0, 3, 1, 2).float() / 127.5 - 1.0  # [N, 3, H, W] in [-1, 1]
        return self.proj(self.convs(x))


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """DrQ-style augmentation: pad by replication and crop back at a random offset per image."""
    n, h, w, _ = images.shape
    padded = F.pad(images.permute(0, 3, 1, 2).float(), (pad, pad, pad, pad), mode="replicate")
    dx = torch.randint(0, 2 * pad + 1, (n,), device=images.device)
    dy = torch.randint(0, 2 * pad + 1, (n,), device=images.device)
    rows = (dy[:, None] + torch.arange(h, device=images.device))[:, :, None].expand(n, h, w)  # [n, h, w]
    cols = (dx[:, None] + torch.arange(w, device=images.device))[:, None, :].expand(n, h, w)
    batch = torch.arange(n, device=images.device)[:, None, None].expand(n, h, w)
    shifted = padded.permute(0, 2, 3, 1)[batch, rows, cols]  # [n, h, w, 3]
    return shifted.to(images.dtype)
