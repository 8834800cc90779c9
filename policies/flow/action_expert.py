"""pi0's action expert: a Gemma-style transformer over [state, noisy actions] that attends, layer by layer,
to the keys/values the VLA prefix cached (openpi's PaliGemma-with-expert joint attention, prefix-cached).

In pi0 the prefix (images + prompt) never attends to the suffix, so running the prefix once, caching each
layer's keys/values, and letting the expert's layer i attend to [prefix keys of layer i, its own keys]
gives the same outputs as openpi's joint forward. Suffix layouts (openpi's embed_suffix):
  pi0:  [state token, H action tokens]; action tokens = MLP(action_in_proj(x_t), sinusoid(t)); the
        state token sees only the prefix and itself, action tokens see everything.
  pi05: [H action tokens] = action_in_proj(x_t); the time embedding enters every RMSNorm (adaRMS:
        scale, shift and a residual gate); the state is part of the prompt instead.
Parameter names follow openpi's modules (`layers.i.self_attn.q_proj`, `action_in_proj`, ...) so the
checkpoint mapping (policies/pretrained/pi0.py) is a prefix rename.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from embodrl.policies.vla.configuration import LanguageModelConfig, VLAArchitecture

RMS_EPS = 1e-6  # Gemma's rms_norm_eps
MIN_PERIOD, MAX_PERIOD = 4e-3, 4.0  # openpi's sinusoidal time embedding, sensitive over t in [0, 1]


def expert_shape(architecture: VLAArchitecture) -> LanguageModelConfig:
    """The preset's action expert, or (presets without one, e.g. nano) a half-width Gemma with the language
    model's depth and attention shape, which the layer-wise joint attention requires."""
    if architecture.action_expert is not None:
        return architecture.action_expert
    lm = architecture.language
    width = lm.hidden_size // 2
    return LanguageModelConfig(
        "gemma", width, lm.num_layers, lm.num_heads, lm.num_kv_heads, lm.head_dim, 2 * width, vocab_size=0
    )


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoid of t [N] -> [N, dim]; periods geometric in [MIN_PERIOD, MAX_PERIOD], in float64."""
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = MIN_PERIOD * (MAX_PERIOD / MIN_PERIOD) ** fraction
    angles = t.double()[:, None] * (2 * math.pi / period)[None]
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(t.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class ExpertRMSNorm(nn.Module):
    """Gemma RMSNorm (scale 1 + w); with `cond_dim` it is pi0.5's adaRMS, whose `dense` layer maps the time
    condition to (scale, shift, gate) and which returns the gate for the residual."""

    def __init__(self, dim: int, cond_dim: int | None = None) -> None:
        super().__init__()
        if cond_dim is None:
            self.weight = nn.Parameter(torch.zeros(dim))
            self.dense = None
        else:
            self.dense = nn.Linear(cond_dim, 3 * dim)
            nn.init.zeros_(self.dense.weight)  # as openpi: starts as a plain norm with a learned bias

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + RMS_EPS)
        if self.dense is None:
            return (normed * (1.0 + self.weight.float())).type_as(x), None
        scale, shift, gate = self.dense(cond).unsqueeze(1).chunk(3, dim=-1)  # each [N, 1, dim]
        return (normed * (1 + scale) + shift).type_as(x), gate


class ExpertAttention(nn.Module):
    """The expert's q/k/v/o projections (Gemma: no biases, grouped key/value heads)."""

    def __init__(self, shape: LanguageModelConfig) -> None:
        super().__init__()
        width, hd = shape.hidden_size, shape.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = shape.num_heads, shape.num_kv_heads, hd
        self.q_proj = nn.Linear(width, shape.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(width, shape.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(width, shape.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(shape.num_heads * hd, width, bias=False)


class GatedMLP(nn.Module):
    """Gemma's GeGLU feed-forward: down(gelu_tanh(gate(x)) * up(x))."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(width, hidden, bias=False)
        self.up_proj = nn.Linear(width, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class ExpertLayer(nn.Module):
    """One pre-norm decoder layer of the expert."""

    def __init__(self, shape: LanguageModelConfig, cond_dim: int | None) -> None:
        super().__init__()
        self.input_layernorm = ExpertRMSNorm(shape.hidden_size, cond_dim)
        self.self_attn = ExpertAttention(shape)
        self.post_attention_layernorm = ExpertRMSNorm(shape.hidden_size, cond_dim)
        self.mlp = GatedMLP(shape.hidden_size, shape.intermediate_size)

    def forward(self, h, prefix_kv, mask, rope, cond) -> torch.Tensor:
        """h [N, S, W]; prefix_kv: keys/values [N, kv, P, hd] (RoPE applied); mask [N, 1, S, P+S] bool."""
        attn, (cos, sin) = self.self_attn, rope
        n, s, _ = h.shape
        x, gate = self.input_layernorm(h, cond)
        q = attn.q_proj(x).view(n, s, attn.num_heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(n, s, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(n, s, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = torch.cat([prefix_kv[0], k], dim=2), torch.cat([prefix_kv[1], v], dim=2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # [N, heads, S, hd]
        out = attn.o_proj(out.transpose(1, 2).reshape(n, s, -1))
        h = h + (out if gate is None else out * gate)
        x, gate = self.post_attention_layernorm(h, cond)
        out = self.mlp(x)
        return h + (out if gate is None else out * gate)


class ActionExpert(nn.Module):
    """Noisy action chunk x_t [N, H, D], time t [N], padded state [N, S] and the prefix cache -> velocity."""

    def __init__(
        self, shape: LanguageModelConfig, variant: str, action_dim: int, state_dim: int, rope_theta: float
    ) -> None:
        super().__init__()
        self.variant, width = variant, shape.hidden_size
        cond_dim = width if variant == "pi05" else None
        self.layers = nn.ModuleList(ExpertLayer(shape, cond_dim) for _ in range(shape.num_layers))
        self.norm = ExpertRMSNorm(width, cond_dim)
        self.action_in_proj = nn.Linear(action_dim, width)
        self.action_out_proj = nn.Linear(width, action_dim)
        if variant == "pi05":
            self.time_mlp_in = nn.Linear(width, width)
            self.time_mlp_out = nn.Linear(width, width)
        else:
            self.state_proj = nn.Linear(state_dim, width)
            self.action_time_mlp_in = nn.Linear(2 * width, width)
            self.action_time_mlp_out = nn.Linear(width, width)
        inv_freq = 1.0 / rope_theta ** (
            torch.arange(0, shape.head_dim, 2, dtype=torch.float32) / shape.head_dim
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, 1, S, hd] for integer positions [N, S] (HF's default RoPE layout)."""
        freqs = positions.float()[..., None] * self.inv_freq  # [N, S, hd/2]
        emb = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)
        return emb.cos(), emb.sin()

    def _suffix(self, x: torch.Tensor, t: torch.Tensor, state: torch.Tensor):
        """Suffix embeddings [N, S, W], which tokens open a new attention block [S], adaRMS condition."""
        actions = self.action_in_proj(x)  # [N, H, W]
        time = time_embedding(t, actions.shape[-1])  # [N, W]
        horizon = x.shape[1]
        if self.variant == "pi05":
            cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(time))))
            return actions, [1] + [0] * (horizon - 1), cond
        fused = torch.cat([actions, time[:, None].expand_as(actions)], dim=-1)
        actions = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(fused)))
        embeds = torch.cat([self.state_proj(state)[:, None], actions], dim=1)
        return embeds, [1, 1] + [0] * (horizon - 1), None

    def forward(self, prefix, state: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Velocity [N, H, D] given the PrefixCache `prefix` (rows matching x)."""
        embeds, blocks, cond = self._suffix(x, t, state)
        n, s, _ = embeds.shape
        block_id = torch.tensor(blocks, device=x.device).cumsum(0)  # token i sees j when block j <= block i
        suffix_mask = (block_id[None, :] <= block_id[:, None]).expand(n, s, s)
        prefix_mask = prefix.mask[:, None, :].expand(n, s, prefix.mask.shape[1])
        mask = torch.cat([prefix_mask, suffix_mask], dim=-1).unsqueeze(1)  # [N, 1, S, P+S]
        positions = prefix.mask.sum(1, keepdim=True) + torch.arange(s, device=x.device)  # after the prefix
        rope = self._rope(positions)
        h = embeds
        for layer, kv in zip(self.layers, prefix.kv, strict=True):
            h = layer(h, kv, mask, rope, cond)
        h, _ = self.norm(h, cond)
        return self.action_out_proj(h[:, -x.shape[1] :])
