"""A tiny OpenVLA(-OFT) checkpoint written in the public layout, and an independent reference forward.

The reference follows the public architecture description, not our modules: timm ViTs (fused qkv, LayerScale,
DINOv2 registers, features of the second-to-last block), Prismatic's fused GELU MLP projector, a Llama-2
decoder (RMSNorm, rotary positions, SwiGLU), OpenVLA's prompt and OFT's parallel-decoding sequence.
"""

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from embodrl.policies.vla.configuration import IMAGENET_MEAN_STD, VisionTowerConfig

IMAGE, PATCH = 28, 14
TOWERS = {  # registered into TIMM_VISION_TOWERS by the tests, as the real ids are
    "tiny_dinov2_reg2": VisionTowerConfig(
        "dinov2", IMAGE, PATCH, 32, 3, 4, 64, 2, *IMAGENET_MEAN_STD, hidden_act="gelu", feature_layer=-2
    ),
    "tiny_siglip": VisionTowerConfig(
        "siglip", IMAGE, PATCH, 48, 3, 4, 80, hidden_act="gelu", feature_layer=-2
    ),
}
LLM = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4}
VOCAB, PAD_MULTIPLE, EPS = 320, 64, 1e-6
STATE_DIM, ACTION_DIM = 5, 4
INSTRUCTIONS = ["Pick up the red cube", "push the blue cube to the left target"]
STATS = {
    "q01": [-0.5, -0.2, -1.5, 0.0],
    "q99": [0.5, 0.4, 1.5, 1.0],
    "mask": [True, True, True, False],
}


def write_tokenizer(directory: Path) -> PreTrainedTokenizerFast:
    """A Llama-style (Metaspace "▁", <unk>/<s>/</s> = 0/1/2) BPE tokenizer saved in the HF layout."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    corpus = [f"In: What action should the robot take to {t.lower()}?\nOut:" for t in INSTRUCTIONS]
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tokenizer.train_from_iterator(corpus * 4, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    wrapped.save_pretrained(str(directory))
    return wrapped


def _rand(*shape: int, scale: float = 0.2) -> torch.Tensor:
    return torch.randn(*shape) * scale


def timm_vit_weights(cfg: VisionTowerConfig, prefix: str) -> dict[str, torch.Tensor]:
    d, hidden, n = cfg.hidden_size, cfg.intermediate_size, cfg.num_patches
    w = {
        "patch_embed.proj.weight": _rand(d, 3, cfg.patch_size, cfg.patch_size, scale=0.05),
        "patch_embed.proj.bias": _rand(d),
        "pos_embed": _rand(1, n, d),
        "norm.weight": 1 + _rand(d),
        "norm.bias": _rand(d),
    }
    if cfg.kind == "dinov2":
        w |= {"cls_token": _rand(1, 1, d), "reg_token": _rand(1, cfg.num_register_tokens, d)}
    else:  # SigLIP's attention-pooling head: present in the checkpoint, unused by Prismatic
        w |= {"attn_pool.latent": _rand(1, 1, d), "attn_pool.kv.weight": _rand(2 * d, d)}
    for i in range(cfg.num_layers):
        b = f"blocks.{i}."
        w |= {
            b + "norm1.weight": 1 + _rand(d),
            b + "norm1.bias": _rand(d),
            b + "attn.qkv.weight": _rand(3 * d, d),
            b + "attn.qkv.bias": _rand(3 * d),
            b + "attn.proj.weight": _rand(d, d),
            b + "attn.proj.bias": _rand(d),
            b + "norm2.weight": 1 + _rand(d),
            b + "norm2.bias": _rand(d),
            b + "mlp.fc1.weight": _rand(hidden, d),
            b + "mlp.fc1.bias": _rand(hidden),
            b + "mlp.fc2.weight": _rand(d, hidden),
            b + "mlp.fc2.bias": _rand(d),
        }
        if cfg.kind == "dinov2":
            w |= {b + "ls1.scale_factor": 1 + _rand(d), b + "ls2.scale_factor": 1 + _rand(d)}
    return {prefix + k: v for k, v in w.items()}


def llama_weights(rows: int) -> dict[str, torch.Tensor]:
    d, hidden = LLM["hidden_size"], LLM["intermediate_size"]
    w = {"model.embed_tokens.weight": _rand(rows, d, scale=1.0), "model.norm.weight": 1 + _rand(d)}
    w["lm_head.weight"] = _rand(rows, d)
    for i in range(LLM["num_hidden_layers"]):
        b = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            w[f"{b}self_attn.{name}.weight"] = _rand(d, d)
        w |= {
            b + "mlp.gate_proj.weight": _rand(hidden, d),
            b + "mlp.up_proj.weight": _rand(hidden, d),
            b + "mlp.down_proj.weight": _rand(d, hidden),
            b + "input_layernorm.weight": 1 + _rand(d),
            b + "post_attention_layernorm.weight": 1 + _rand(d),
        }
    return {"language_model." + k: v for k, v in w.items()}


def write_checkpoint(directory: Path, oft: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
    """Config, two safetensors shards + index, statistics, tokenizer (and OFT's proprio projector)."""
    torch.manual_seed(seed)
    directory.mkdir(parents=True, exist_ok=True)
    ids = list(TOWERS)
    dino, siglip = TOWERS[ids[0]], TOWERS[ids[1]]
    vision, llm = dino.hidden_size + siglip.hidden_size, LLM["hidden_size"]
    weights = timm_vit_weights(dino, "vision_backbone.featurizer.")
    weights |= timm_vit_weights(siglip, "vision_backbone.fused_featurizer.")
    weights |= {
        "projector.fc1.weight": _rand(4 * vision, vision),
        "projector.fc1.bias": _rand(4 * vision),
        "projector.fc2.weight": _rand(llm, 4 * vision),
        "projector.fc2.bias": _rand(llm),
        "projector.fc3.weight": _rand(llm, llm),
        "projector.fc3.bias": _rand(llm),
    }
    weights |= llama_weights(VOCAB + PAD_MULTIPLE)
    keys = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, shard_keys in shards.items():
        save_file({k: weights[k].contiguous() for k in shard_keys}, str(directory / name))
    weight_map = {k: name for name, shard_keys in shards.items() for k in shard_keys}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    config = {
        "model_type": "openvla",
        "use_fused_vision_backbone": True,
        "timm_model_ids": ids,
        "image_sizes": [IMAGE, IMAGE],
        "timm_override_act_layers": [None, None],
        "text_config": {"model_type": "llama", "vocab_size": VOCAB + PAD_MULTIPLE, **LLM},
        "pad_to_multiple_of": PAD_MULTIPLE,
        "n_action_bins": 256,
        "llm_backbone_id": "llama2-7b-pure",
    }
    (directory / "config.json").write_text(json.dumps(config))
    stats = {"action": STATS}
    if oft:
        proprio = {
            "fc1.weight": _rand(llm, STATE_DIM),
            "fc1.bias": _rand(llm),
            "fc2.weight": _rand(llm, llm),
            "fc2.bias": _rand(llm),
        }
        torch.save(
            {"module." + k: v for k, v in proprio.items()}, directory / "proprio_projector--50_checkpoint.pt"
        )
        weights |= {"proprio." + k: v for k, v in proprio.items()}
        stats["proprio"] = {"q01": [-1.0, 0.0, -2.0, 0.5, -0.3], "q99": [1.0, 2.0, 0.0, 1.5, 0.3]}
    (directory / "dataset_statistics.json").write_text(json.dumps({"tiny_dataset": stats}))
    write_tokenizer(directory)
    return weights


# ----- the reference forward -----


def reference_vit(w: dict, prefix: str, cfg: VisionTowerConfig, pixels: torch.Tensor) -> torch.Tensor:
    """timm ViT, output of block L-2 without the final norm, prefix (CLS/register) tokens dropped."""
    g = lambda name: w[prefix + name]  # noqa: E731
    x = F.conv2d(pixels, g("patch_embed.proj.weight"), g("patch_embed.proj.bias"), stride=cfg.patch_size)
    x = x.flatten(2).transpose(1, 2) + g("pos_embed")  # [N, P, D]; DINOv2: no position for CLS
    extra = 0
    if cfg.kind == "dinov2":
        n = x.shape[0]
        x = torch.cat([g("cls_token").expand(n, -1, -1), g("reg_token").expand(n, -1, -1), x], dim=1)
        extra = 1 + cfg.num_register_tokens
    heads, d = cfg.num_heads, cfg.hidden_size
    for i in range(cfg.num_layers - 1):
        b = f"blocks.{i}."
        h = F.layer_norm(x, (d,), g(b + "norm1.weight"), g(b + "norm1.bias"), eps=1e-6)
        q, k, v = F.linear(h, g(b + "attn.qkv.weight"), g(b + "attn.qkv.bias")).chunk(3, dim=-1)
        split = lambda t: t.view(*t.shape[:2], heads, -1).transpose(1, 2)  # noqa: E731
        att = torch.softmax(split(q) @ split(k).transpose(-1, -2) / math.sqrt(d // heads), dim=-1) @ split(v)
        a = F.linear(att.transpose(1, 2).flatten(2), g(b + "attn.proj.weight"), g(b + "attn.proj.bias"))
        x = x + (a * g(b + "ls1.scale_factor") if cfg.kind == "dinov2" else a)
        h = F.layer_norm(x, (d,), g(b + "norm2.weight"), g(b + "norm2.bias"), eps=1e-6)
        m = F.linear(
            F.gelu(F.linear(h, g(b + "mlp.fc1.weight"), g(b + "mlp.fc1.bias"))), g(b + "mlp.fc2.weight")
        )
        m = m + g(b + "mlp.fc2.bias")
        x = x + (m * g(b + "ls2.scale_factor") if cfg.kind == "dinov2" else m)
    return x[:, extra:]


def reference_patches(w: dict, images: torch.Tensor) -> torch.Tensor:
    """uint8 [N, H, W, 3] -> projected patches [N, P, llm] (DINOv2 | SigLIP features, fused GELU MLP)."""
    pixels = images.permute(0, 3, 1, 2).float() / 255
    dino, siglip = TOWERS.values()
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in IMAGENET_MEAN_STD)
    features = torch.cat(
        [
            reference_vit(w, "vision_backbone.featurizer.", dino, (pixels - mean) / std),
            reference_vit(w, "vision_backbone.fused_featurizer.", siglip, (pixels - 0.5) / 0.5),
        ],
        dim=-1,
    )
    x = F.gelu(F.linear(features, w["projector.fc1.weight"], w["projector.fc1.bias"]))
    x = F.gelu(F.linear(x, w["projector.fc2.weight"], w["projector.fc2.bias"]))
    return F.linear(x, w["projector.fc3.weight"], w["projector.fc3.bias"])


def reference_llama(w: dict, embeds: torch.Tensor, causal: bool) -> torch.Tensor:
    """Llama-2 decoder over one unpadded sequence [1, T, D] -> logits [1, T, rows]."""
    g = lambda name: w["language_model." + name]  # noqa: E731
    d, heads = LLM["hidden_size"], LLM["num_attention_heads"]
    hd, t = d // heads, embeds.shape[1]
    rms = lambda x, weight: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight  # noqa: E731
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    angles = torch.outer(torch.arange(t).float(), inv_freq)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    rotate = lambda x: torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], dim=-1)  # noqa: E731
    x = embeds
    for i in range(LLM["num_hidden_layers"]):
        b = f"model.layers.{i}."
        h = rms(x, g(b + "input_layernorm.weight"))
        q, k, v = (
            F.linear(h, g(f"{b}self_attn.{n}_proj.weight")).view(1, t, heads, hd).transpose(1, 2)
            for n in "qkv"
        )
        q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        if causal:
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        att = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(1, t, d)
        x = x + F.linear(att, g(b + "self_attn.o_proj.weight"))
        h = rms(x, g(b + "post_attention_layernorm.weight"))
        gate, up = F.linear(h, g(b + "mlp.gate_proj.weight")), F.linear(h, g(b + "mlp.up_proj.weight"))
        x = x + F.linear(F.silu(gate) * up, g(b + "mlp.down_proj.weight"))
    return rms(x, g("model.norm.weight")) @ g("lm_head.weight").T


def prompt_ids(tokenizer, instruction: str) -> list[int]:
    """OpenVLA's input ids: BOS + prompt, with the empty "▁" token appended after "Out:"."""
    ids = tokenizer(f"In: What action should the robot take to {instruction.lower()}?\nOut:")["input_ids"]
    ids = [tokenizer.bos_token_id] + [i for i in ids if i != tokenizer.bos_token_id]
    empty = tokenizer.convert_tokens_to_ids("▁")
    return ids if ids[-1] == empty else [*ids, empty]


def reference_openvla_logits(w, tokenizer, image, instruction, action_tokens) -> torch.Tensor:
    """OpenVLA teacher-forced: logits [len(actions), rows] predicting each action token."""
    embed = w["language_model.model.embed_tokens.weight"]
    ids = torch.tensor(prompt_ids(tokenizer, instruction))
    seq = [embed[ids[:1]], reference_patches(w, image[None])[0], embed[ids[1:]], embed[action_tokens[:-1]]]
    logits = reference_llama(w, torch.cat(seq)[None], causal=True)[0]
    return logits[-len(action_tokens) :]


def reference_oft_logits(w, tokenizer, images, instruction, proprio, num_slots) -> torch.Tensor:
    """OpenVLA-OFT parallel decoding: [BOS][patches][proprio][prompt][zeros x C*A][</s>], bidirectional,
    logits read from NUM_PATCHES + NUM_PROMPT_TOKENS on."""
    embed = w["language_model.model.embed_tokens.weight"]
    ids = prompt_ids(tokenizer, instruction)
    patches = torch.cat([reference_patches(w, image[None])[0] for image in images])
    low, high = (torch.tensor(v) for v in (w["proprio_q01"], w["proprio_q99"]))
    normalized = 2 * (proprio - low) / (high - low + 1e-8) - 1
    x = F.gelu(F.linear(normalized, w["proprio.fc1.weight"], w["proprio.fc1.bias"]))
    proprio_token = F.linear(x, w["proprio.fc2.weight"], w["proprio.fc2.bias"])[None]
    ids_t = torch.tensor(ids)
    stop = embed[torch.tensor([tokenizer.eos_token_id])]
    zeros = torch.zeros(num_slots, embed.shape[1])
    seq = torch.cat([embed[ids_t[:1]], patches, proprio_token, embed[ids_t[1:]], zeros, stop])
    logits = reference_llama(w, seq[None], causal=False)[0]
    start = patches.shape[0] + 1 + len(ids) - 1  # NUM_PATCHES (+ proprio) + NUM_PROMPT_TOKENS
    return logits[start : start + num_slots]
