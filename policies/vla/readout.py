"""Reading a fixed-size summary out of the VLA prefix's last hidden states, for heads that take one vector
(the diffusion denoiser MLP, value heads).

"pool": the mean over real positions joined with the last position (no parameters). "attention": learned
queries attend over every real position (multi-head), as Octo's readout tokens and SigLIP's attention-pooling
head do, so the head can pick out the image cells that matter instead of their average; the pool is kept
beside it. Keys and values get a learned embedding of their position (real tokens counted, as the language
model counts them): the language model's rotary positions never enter its hidden states, and where the cube
is lies in which image cell shows it.
"""

from __future__ import annotations

import torch
from torch import nn

from embodrl.policies.vla.modeling import pool, positions_from_mask


class PrefixReadout(nn.Module):
    """[N, P, H] hidden states + [N, P] bool mask -> [N, out_dim] features."""

    def __init__(
        self, kind: str, hidden_size: int, num_queries: int = 0, num_heads: int = 1, max_positions: int = 0
    ) -> None:
        super().__init__()
        self.kind = kind
        self.out_dim = 2 * hidden_size
        if kind == "attention":
            self.queries = nn.Parameter(torch.randn(num_queries, hidden_size) * hidden_size**-0.5)
            self.positions = nn.Embedding(max_positions, hidden_size)
            self.norm = nn.LayerNorm(hidden_size)
            self.attention = nn.MultiheadAttention(hidden_size, num_heads, batch_first=True)
            self.out_dim += num_queries * hidden_size

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pooled = pool(hidden, mask)
        if self.kind == "pool":
            return pooled
        queries = self.queries.unsqueeze(0).expand(hidden.shape[0], -1, -1)
        keys = self.norm(hidden) + self.positions(positions_from_mask(mask))
        read, _ = self.attention(queries, keys, keys, key_padding_mask=~mask.bool(), need_weights=False)
        return torch.cat([pooled, read.flatten(1)], dim=-1)
