"""timm ViT weights (Prismatic's featurizers) <-> the `transformers` SigLIP / DINOv2 towers of VLABackbone.

Names on the timm side: patch_embed.proj, pos_embed, cls_token, reg_token, blocks.N.{norm1, attn.qkv,
attn.proj, ls1.scale_factor, norm2, mlp.fc1, mlp.fc2, ls2.scale_factor}, norm (OpenVLA's HF port renames
LayerScale's `gamma` to `scale_factor`). The fused qkv projection is split into q/k/v on import and
concatenated on export. timm's DINOv2 adds no position embedding to the CLS token, transformers' does: the
import gives CLS a zero position embedding, the export folds it into the CLS token (exact both ways).
"""

from __future__ import annotations

import torch

from embodrl.policies.vla.configuration import VisionTowerConfig

# Keys timm models carry that Prismatic's forward never reads (SigLIP's attention-pooling head).
UNUSED_PREFIXES = ("attn_pool.",)


def _block_pairs(kind: str, i: int) -> list[tuple[str, str]]:
    """(transformers name, timm name) of the 1:1 tensors of block i."""
    if kind == "siglip":
        ours = f"encoder.layers.{i}."
        pairs = [("layer_norm1", "norm1"), ("self_attn.out_proj", "attn.proj"), ("layer_norm2", "norm2")]
    else:
        ours = f"encoder.layer.{i}."
        pairs = [("norm1", "norm1"), ("attention.o_proj", "attn.proj"), ("norm2", "norm2")]
    pairs += [("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2")]
    names = [(f"{ours}{a}.{p}", f"blocks.{i}.{b}.{p}") for a, b in pairs for p in ("weight", "bias")]
    if kind == "dinov2":
        names += [(f"{ours}layer_scale{k}.lambda1", f"blocks.{i}.ls{k}.scale_factor") for k in (1, 2)]
    return names


def _qkv_names(kind: str, i: int) -> tuple[str, ...]:
    prefix = f"encoder.layers.{i}.self_attn." if kind == "siglip" else f"encoder.layer.{i}.attention."
    return tuple(f"{prefix}{p}_proj" for p in "qkv")


def _embedding_pairs(kind: str) -> list[tuple[str, str]]:
    if kind == "siglip":
        return [(f"embeddings.patch_embedding.{p}", f"patch_embed.proj.{p}") for p in ("weight", "bias")] + [
            (f"post_layernorm.{p}", f"norm.{p}") for p in ("weight", "bias")
        ]
    return [
        ("embeddings.register_tokens", "reg_token"),
        *[
            (f"embeddings.patch_embeddings.projection.{p}", f"patch_embed.proj.{p}")
            for p in ("weight", "bias")
        ],
        *[(f"layernorm.{p}", f"norm.{p}") for p in ("weight", "bias")],
    ]


def tower_from_timm(cfg: VisionTowerConfig, timm: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm state dict of one featurizer (prefix stripped) -> the tower's transformers state dict.

    Missing timm keys raise KeyError naming them (the caller turns that into a UserError)."""
    ours = {a: timm[b] for a, b in _embedding_pairs(cfg.kind)}
    for i in range(cfg.num_layers):
        ours.update({a: timm[b] for a, b in _block_pairs(cfg.kind, i)})
        for param in ("weight", "bias"):
            fused = timm[f"blocks.{i}.attn.qkv.{param}"]  # [3D, ...]: q, k, v stacked
            for name, part in zip(_qkv_names(cfg.kind, i), fused.chunk(3, dim=0), strict=True):
                ours[f"{name}.{param}"] = part
    pos = timm["pos_embed"]  # [1, patches, D]
    if cfg.kind == "siglip":
        ours["embeddings.position_embedding.weight"] = pos[0]
    else:
        ours["embeddings.position_embeddings"] = torch.cat([torch.zeros_like(pos[:, :1]), pos], dim=1)
        ours["embeddings.cls_token"] = timm["cls_token"]
        ours["embeddings.mask_token"] = torch.zeros(1, pos.shape[-1], dtype=pos.dtype)  # unused (no masking)
    return ours


def tower_to_timm(cfg: VisionTowerConfig, ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of `tower_from_timm` (the DINOv2 mask token, never used, is dropped)."""
    timm = {b: ours[a] for a, b in _embedding_pairs(cfg.kind)}
    for i in range(cfg.num_layers):
        timm.update({b: ours[a] for a, b in _block_pairs(cfg.kind, i)})
        for param in ("weight", "bias"):
            parts = [ours[f"{name}.{param}"] for name in _qkv_names(cfg.kind, i)]
            timm[f"blocks.{i}.attn.qkv.{param}"] = torch.cat(parts, dim=0)
    if cfg.kind == "siglip":
        timm["pos_embed"] = ours["embeddings.position_embedding.weight"].unsqueeze(0)
    else:
        pos = ours["embeddings.position_embeddings"]  # [1, 1 + patches, D]
        timm["pos_embed"] = pos[:, 1:]
        timm["cls_token"] = ours["embeddings.cls_token"] + pos[:, :1]
    return timm
