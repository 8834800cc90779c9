"""Test fixtures for the pi0 import: a tiny random checkpoint in openpi's / LeRobot's PyTorch layouts and an
independent reference forward of the public architecture (PaliGemma + Gemma expert joint attention, as in
openpi's PaliGemmaWithExpertModel: one attention over [prefix, suffix] per layer, no key/value cache).
"""

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from embodrl.policies.vla.tokenizer import train_tokenizer

PG, EX = "paligemma_with_expert.paligemma.", "paligemma_with_expert.gemma_expert."
VISION = PG + "model.vision_tower.vision_model."
LM = PG + "model.language_model."
# openpi's "dummy" Gemma (width 64, depth 4, mlp 128, 8 heads, 1 kv head, head_dim 16) for both parts.
WIDTH, DEPTH, MLP, HEADS, HEAD_DIM = 64, 4, 128, 8, 16
VOCAB, IMAGE, PATCH, V_WIDTH, V_MLP, V_HEADS = 1024, 32, 8, 144, 64, 2  # SigLIP: 72-wide heads
HORIZON, MODEL_DIM, STATE_DIM, ACTION_DIM = 10, 32, 5, 4
INSTRUCTIONS = ("pick up the red cube", "push the blue_cube to the target")


def tiny_weights(variant: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under the public key names (the tied embedding under `lm_head`, as save_model keeps)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    w = {
        VISION + "embeddings.patch_embedding.weight": rand(V_WIDTH, 3, PATCH, PATCH, scale=0.05),
        VISION + "embeddings.patch_embedding.bias": rand(V_WIDTH),
        VISION + "embeddings.position_embedding.weight": rand((IMAGE // PATCH) ** 2, V_WIDTH),
        VISION + "post_layernorm.weight": 1 + rand(V_WIDTH),
        VISION + "post_layernorm.bias": rand(V_WIDTH),
        PG + "model.multi_modal_projector.linear.weight": rand(WIDTH, V_WIDTH, scale=0.1),
        PG + "model.multi_modal_projector.linear.bias": rand(WIDTH),
        PG + "lm_head.weight": rand(VOCAB, WIDTH, scale=0.05),
        EX + "lm_head.weight": rand(VOCAB, WIDTH),
        LM + "norm.weight": rand(WIDTH),
        "action_in_proj.weight": rand(WIDTH, MODEL_DIM),
        "action_in_proj.bias": rand(WIDTH),
        "action_out_proj.weight": rand(MODEL_DIM, WIDTH),
        "action_out_proj.bias": rand(MODEL_DIM),
    }
    layer = VISION + "encoder.layers.0."
    for name in ("layer_norm1", "layer_norm2"):
        w[layer + name + ".weight"], w[layer + name + ".bias"] = 1 + rand(V_WIDTH), rand(V_WIDTH)
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        w[f"{layer}self_attn.{name}.weight"] = rand(V_WIDTH, V_WIDTH, scale=0.08)
        w[f"{layer}self_attn.{name}.bias"] = rand(V_WIDTH)
    w[layer + "mlp.fc1.weight"], w[layer + "mlp.fc1.bias"] = rand(V_MLP, V_WIDTH, scale=0.08), rand(V_MLP)
    w[layer + "mlp.fc2.weight"], w[layer + "mlp.fc2.bias"] = rand(V_WIDTH, V_MLP, scale=0.1), rand(V_WIDTH)
    for root in (LM, EX + "model."):
        for i in range(DEPTH):
            p = f"{root}layers.{i}."
            w[p + "self_attn.q_proj.weight"] = rand(HEADS * HEAD_DIM, WIDTH)
            w[p + "self_attn.k_proj.weight"] = rand(HEAD_DIM, WIDTH)
            w[p + "self_attn.v_proj.weight"] = rand(HEAD_DIM, WIDTH)
            w[p + "self_attn.o_proj.weight"] = rand(WIDTH, HEADS * HEAD_DIM, scale=0.1)
            w[p + "mlp.gate_proj.weight"] = rand(MLP, WIDTH)
            w[p + "mlp.up_proj.weight"] = rand(MLP, WIDTH)
            w[p + "mlp.down_proj.weight"] = rand(WIDTH, MLP, scale=0.1)
            for norm in ("input_layernorm", "post_attention_layernorm"):
                if variant == "pi05" and root != LM:
                    w[f"{p}{norm}.dense.weight"] = rand(3 * WIDTH, WIDTH, scale=0.05)
                    w[f"{p}{norm}.dense.bias"] = rand(3 * WIDTH)
                else:
                    w[f"{p}{norm}.weight"] = rand(WIDTH)
    if variant == "pi05":
        w[EX + "model.norm.dense.weight"] = rand(3 * WIDTH, WIDTH, scale=0.05)
        w[EX + "model.norm.dense.bias"] = rand(3 * WIDTH)
        for name in ("time_mlp_in", "time_mlp_out"):
            w[name + ".weight"], w[name + ".bias"] = rand(WIDTH, WIDTH), rand(WIDTH)
    else:
        w[EX + "model.norm.weight"] = rand(WIDTH)
        w["state_proj.weight"], w["state_proj.bias"] = rand(WIDTH, MODEL_DIM), rand(WIDTH)
        w["action_time_mlp_in.weight"] = rand(WIDTH, 2 * WIDTH)
        w["action_time_mlp_in.bias"] = rand(WIDTH)
        w["action_time_mlp_out.weight"], w["action_time_mlp_out.bias"] = rand(WIDTH, WIDTH), rand(WIDTH)
    return w


def tiny_stats(seed: int = 0) -> dict[str, dict[str, list[float]]]:
    g = np.random.default_rng(seed)
    stats = {}
    for key, dim in (("state", STATE_DIM), ("action", ACTION_DIM)):
        mean, std = g.normal(size=dim), g.uniform(0.5, 2.0, size=dim)
        stats[key] = {"mean": mean, "std": std, "q01": mean - 2 * std, "q99": mean + 2 * std}
    return {k: {s: v.tolist() for s, v in st.items()} for k, st in stats.items()}


def write_checkpoint(directory: Path, variant: str, fmt: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Write the tiny checkpoint folder (weights, config, stats, a tokenizer.json); returns the weights."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = tiny_weights(variant, seed)
    stats = tiny_stats(seed)
    config = {"paligemma_variant": "dummy", "action_expert_variant": "dummy"}
    if fmt == "openpi":
        save_file(weights, str(directory / "model.safetensors"))
        config |= {"action_dim": MODEL_DIM, "action_horizon": HORIZON, "precision": "float32"}
        (directory / "assets" / "libero").mkdir(parents=True)
        norm = {"state": stats["state"], "actions": stats["action"]}
        (directory / "assets" / "libero" / "norm_stats.json").write_text(json.dumps({"norm_stats": norm}))
    else:
        save_file({f"model.{k}": v for k, v in weights.items()}, str(directory / "model.safetensors"))
        config |= {"type": variant, "chunk_size": HORIZON, "max_state_dim": 32, "max_action_dim": MODEL_DIM}
        config["tokenizer_max_length"] = 24 if variant == "pi0" else 40
        flat = {
            f"{'observation.state' if k == 'state' else 'action'}.{s}": torch.tensor(v, dtype=torch.float32)
            for k, st in stats.items()
            for s, v in st.items()
        }
        save_file(flat, str(directory / "policy_preprocessor_step_5_normalizer_processor.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    train_tokenizer(INSTRUCTIONS, 512).save_pretrained(str(directory))
    return weights


def rms_norm(x, weight=None, dense=None, cond=None):
    """Gemma RMSNorm (1 + w), or adaRMS: (scale, shift, gate) = dense(cond); returns (y, gate)."""
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    if dense is None:
        return normed * (1 + weight), None
    scale, shift, gate = F.linear(cond, *dense)[:, None].chunk(3, dim=-1)
    return normed * (1 + scale) + shift, gate


def attention(q, k, v, mask, heads, kv_heads):
    """Multi-head attention with an additive mask; q [N, T, heads*hd], k/v [N, T, kv*hd]."""
    n, t, _ = q.shape
    hd = q.shape[-1] // heads
    q = q.view(n, t, heads, hd).transpose(1, 2)
    k = k.view(n, t, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, 1)
    v = v.view(n, t, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd) + mask
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, t, heads * hd)


def siglip(w, pixels):
    """SigLIP ViT patch features of pixels [N, 3, H, W] in [-1, 1]."""
    x = F.conv2d(
        pixels,
        w[VISION + "embeddings.patch_embedding.weight"],
        w[VISION + "embeddings.patch_embedding.bias"],
        stride=PATCH,
    )
    x = x.flatten(2).transpose(1, 2) + w[VISION + "embeddings.position_embedding.weight"]
    p = VISION + "encoder.layers.0."
    ln = lambda h, name: F.layer_norm(h, (V_WIDTH,), w[p + name + ".weight"], w[p + name + ".bias"], 1e-6)  # noqa: E731
    lin = lambda h, name: F.linear(h, w[p + name + ".weight"], w[p + name + ".bias"])  # noqa: E731
    h = ln(x, "layer_norm1")
    qkv = [lin(h, f"self_attn.{n}_proj") for n in "qkv"]
    x = x + lin(attention(*qkv, torch.zeros(()), V_HEADS, V_HEADS), "self_attn.out_proj")
    x = x + lin(F.gelu(lin(ln(x, "layer_norm2"), "mlp.fc1"), approximate="tanh"), "mlp.fc2")
    return F.layer_norm(
        x, (V_WIDTH,), w[VISION + "post_layernorm.weight"], w[VISION + "post_layernorm.bias"], 1e-6
    )


def rope(x, positions, heads):
    """Rotary embedding on x [N, T, heads*hd] at integer positions [N, T]."""
    n, t, _ = x.shape
    hd = x.shape[-1] // heads
    inv_freq = 1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd)
    angles = positions.float()[..., None] * inv_freq
    cos, sin = (
        torch.cat([angles, angles], -1).cos()[:, :, None],
        torch.cat([angles, angles], -1).sin()[:, :, None],
    )
    x = x.view(n, t, heads, hd)
    rotated = torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], dim=-1)
    return (x * cos + rotated * sin).reshape(n, t, heads * hd)


def time_embedding(t, dim):
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64)
    period = 4e-3 * (4.0 / 4e-3) ** fraction
    angle = t.double()[:, None] * 2 * math.pi / period
    return torch.cat([angle.sin(), angle.cos()], dim=1).float()


def reference_velocity(w, variant, images, ids, ids_mask, state, x_t, t):
    """openpi's forward on [prefix, suffix] with block attention; images: list of [N, 3, H, W] in [-1, 1]."""
    n = x_t.shape[0]
    proj = lambda h: F.linear(
        h,
        w[PG + "model.multi_modal_projector.linear.weight"],
        w[PG + "model.multi_modal_projector.linear.bias"],
    )  # noqa: E731
    prefix = [proj(siglip(w, img)) for img in images] + [w[PG + "lm_head.weight"][ids] * math.sqrt(WIDTH)]
    prefix = torch.cat(prefix, dim=1)
    prefix_pad = torch.cat([torch.ones(n, prefix.shape[1] - ids.shape[1], dtype=torch.bool), ids_mask], 1)
    lin = lambda h, name: F.linear(h, w[name + ".weight"], w[name + ".bias"])  # noqa: E731
    actions = lin(x_t, "action_in_proj")
    temb = time_embedding(t, WIDTH)
    if variant == "pi05":
        cond = F.silu(lin(F.silu(lin(temb, "time_mlp_in")), "time_mlp_out"))
        suffix, suffix_ar = actions, [1] + [0] * (HORIZON - 1)
    else:
        cond = None
        mixed = lin(
            F.silu(lin(torch.cat([actions, temb[:, None].expand_as(actions)], -1), "action_time_mlp_in")),
            "action_time_mlp_out",
        )
        suffix = torch.cat([lin(state, "state_proj")[:, None], mixed], dim=1)
        suffix_ar = [1, 1] + [0] * (HORIZON - 1)
    pad = torch.cat([prefix_pad, torch.ones(n, suffix.shape[1], dtype=torch.bool)], 1)
    ar = torch.tensor([0] * prefix.shape[1] + suffix_ar).cumsum(0)
    allowed = (ar[None, :] <= ar[:, None])[None] & pad[:, None, :] & pad[:, :, None]
    mask = torch.where(allowed, 0.0, -1e30)[:, None]  # openpi's large negative, not -inf
    positions = pad.long().cumsum(1) - 1
    hidden, roots, conds = [prefix, suffix], (LM, EX + "model."), (None, cond)
    p_len = prefix.shape[1]
    for i in range(DEPTH):
        gates, qs, ks, vs = [], [], [], []
        for h, root, c in zip(hidden, roots, conds, strict=True):
            p = f"{root}layers.{i}."
            dense = (
                (w[p + "input_layernorm.dense.weight"], w[p + "input_layernorm.dense.bias"])
                if c is not None
                else None
            )
            x, gate = rms_norm(h, w.get(p + "input_layernorm.weight"), dense, c)
            gates.append(gate)
            qs.append(F.linear(x, w[p + "self_attn.q_proj.weight"]))
            ks.append(F.linear(x, w[p + "self_attn.k_proj.weight"]))
            vs.append(F.linear(x, w[p + "self_attn.v_proj.weight"]))
        q, k = rope(torch.cat(qs, 1), positions, HEADS), rope(torch.cat(ks, 1), positions, 1)
        out = attention(q, k, torch.cat(vs, 1), mask, HEADS, 1)
        new = []
        for j, (h, root, c, out_j) in enumerate(
            zip(hidden, roots, conds, (out[:, :p_len], out[:, p_len:]), strict=True)
        ):
            p = f"{root}layers.{i}."
            y = F.linear(out_j, w[p + "self_attn.o_proj.weight"])
            h = h + (y if gates[j] is None else y * gates[j])
            dense = (
                (w[p + "post_attention_layernorm.dense.weight"], w[p + "post_attention_layernorm.dense.bias"])
                if c is not None
                else None
            )
            x, gate = rms_norm(h, w.get(p + "post_attention_layernorm.weight"), dense, c)
            y = F.linear(
                F.gelu(F.linear(x, w[p + "mlp.gate_proj.weight"]), approximate="tanh")
                * F.linear(x, w[p + "mlp.up_proj.weight"]),
                w[p + "mlp.down_proj.weight"],
            )
            new.append(h + (y if gate is None else y * gate))
        hidden = new
    dense = (w[EX + "model.norm.dense.weight"], w[EX + "model.norm.dense.bias"]) if cond is not None else None
    out, _ = rms_norm(hidden[1], w.get(EX + "model.norm.weight"), dense, cond)
    return lin(out[:, -HORIZON:], "action_out_proj")
