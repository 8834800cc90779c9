"""pi0 / pi0.5 checkpoints in their PyTorch layouts <-> embodrl's flow family with the VLA action expert.

Layouts (a folder each):
  openpi  (its JAX -> PyTorch conversion): model.safetensors with `paligemma_with_expert.*`,
          `action_in_proj.*`, ...; config.json {action_dim, action_horizon, paligemma_variant,
          action_expert_variant, precision};
          assets/<asset_id>/norm_stats.json {"norm_stats": {"state": {...}, "actions": {...}}}.
  lerobot (PI0Policy / PI05Policy): the same keys under `model.`; config.json with "type" pi0 | pi05 and the
          same variant fields; stats in policy_preprocessor_step_*_normalizer_processor.safetensors
          (`observation.state.mean`, `action.q01`, ...).
pi0 vs pi0.5 is read from the weights (`time_mlp_in` + adaRMS `dense` norms mean pi0.5). A LeRobot checkpoint
keeps LeRobot's prompts: the pi0 instruction as given (openpi cleans it), the pi0.5 state zero-padded to
max_state_dim before it is discretized into the prompt (openpi: the state as is). Dimensions come
from the variant names (openpi's Gemma table) and the tensors (vocabulary, SigLIP tower). The PaliGemma
`lm_head` is tied to the token embeddings and the expert's `lm_head` is never used (the expert has no
vocabulary): both are read only as fallbacks and written back for loaders that expect them. The
Flow-Noise / Flow-SDE head and the value head are new parameters with their fresh initialisation.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from embodrl.errors import UserError
from embodrl.obs_keys import IMAGE_KEYS, STATE
from embodrl.policies.config import PolicyConfig
from embodrl.policies.flow.action_expert import expert_shape
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.flow.modeling import FlowPolicy
from embodrl.policies.loading import load_policy
from embodrl.policies.normalization import STAT_NAMES
from embodrl.policies.vla.configuration import (
    PRESETS,
    LanguageModelConfig,
    VisionTowerConfig,
    VLAArchitecture,
    VLAConfig,
)
from embodrl.policies.vla.tokenizer import load_tokenizer

FORMATS = ("openpi", "lerobot")
SOURCE_PREFIX = {"openpi": "", "lerobot": "model."}
PALIGEMMA = "paligemma_with_expert.paligemma."
EXPERT = "paligemma_with_expert.gemma_expert."
EMBED_KEY = PALIGEMMA + "model.language_model.embed_tokens.weight"
LM_HEAD_KEY = PALIGEMMA + "lm_head.weight"  # tied to EMBED_KEY; the name safetensors' save_model keeps
EXPERT_LM_HEAD_KEY = EXPERT + "lm_head.weight"  # present in the layouts, unused by pi0
# (source prefix, embodrl prefix), source side without the lerobot `model.` prefix.
KEY_PREFIXES = (
    (PALIGEMMA + "model.vision_tower.vision_model.", "prefix_encoder.backbone.vision_towers.0."),
    (PALIGEMMA + "model.multi_modal_projector.linear.", "prefix_encoder.backbone.projector."),
    (PALIGEMMA + "model.language_model.", "prefix_encoder.backbone.language_model."),
    (EXPERT + "model.layers.", "action_expert.layers."),
    (EXPERT + "model.norm.", "action_expert.norm."),
    *(
        (f"{name}.", f"action_expert.{name}.")
        for name in (
            "action_in_proj",
            "action_out_proj",
            "state_proj",
            "action_time_mlp_in",
            "action_time_mlp_out",
            "time_mlp_in",
            "time_mlp_out",
        )
    ),
)
# openpi's Gemma variants (gemma.get_config): width, depth, mlp_dim, num_heads, num_kv_heads, head_dim.
GEMMA_VARIANTS = {
    "gemma_2b": (2048, 18, 16384, 8, 1, 256),
    "gemma_300m": (1024, 18, 4096, 8, 1, 256),
    "dummy": (64, 4, 128, 8, 1, 16),
}
SIGLIP_HEAD_DIM = 72  # SigLIP So400m/14: 1152 wide, 16 heads
MAX_POSITIONS = 8192
PADDED_DIM = 32  # openpi zero-pads states and actions to 32 dims
STATS_KEYS = {
    "openpi": {"state": "state", "action": "actions"},
    "lerobot": {"state": "observation.state", "action": "action"},
}
NORMALIZATION = {"pi0": "mean_std", "pi05": "quantile"}  # openpi: quantile norm for pi0.5
PROMPT_TOKENS = {"pi0": 48, "pi05": 200}  # openpi's max_token_len


def to_embodrl_key(source_key: str) -> str | None:
    """Our parameter name for a source key (without the lerobot prefix), None when it has none."""
    for source, ours in KEY_PREFIXES:
        if source_key.startswith(source):
            return ours + source_key[len(source) :]
    return None


def to_source_key(our_key: str) -> str | None:
    """Inverse of `to_embodrl_key`: None for embodrl-only parameters (heads, critic, normalizers)."""
    for source, ours in KEY_PREFIXES:
        if our_key.startswith(ours):
            return source + our_key[len(ours) :]
    return None


def gemma_config(variant: str, vocab_size: int) -> LanguageModelConfig:
    """A LanguageModelConfig for one of openpi's Gemma variant names (LoRA variants share the shapes)."""
    name = variant.removesuffix("_lora")
    if name not in GEMMA_VARIANTS:
        raise UserError(
            f"unknown Gemma variant {variant!r} in config.json; known: {', '.join(GEMMA_VARIANTS)}"
        )
    width, depth, mlp_dim, heads, kv_heads, head_dim = GEMMA_VARIANTS[name]
    return LanguageModelConfig(
        "gemma", width, depth, heads, kv_heads, head_dim, mlp_dim, vocab_size, max_positions=MAX_POSITIONS
    )


def variant_name(lm: LanguageModelConfig) -> str:
    """The openpi variant name of a Gemma shape (for config.json on export)."""
    shape = (lm.hidden_size, lm.num_layers, lm.intermediate_size, lm.num_heads, lm.num_kv_heads, lm.head_dim)
    for name, dims in GEMMA_VARIANTS.items():
        if dims == shape:
            return name
    raise UserError(
        f"the policy's Gemma shape {shape} is none of openpi's variants ({', '.join(GEMMA_VARIANTS)})"
    )


def architecture_from(config: dict, weights: dict[str, torch.Tensor]) -> VLAArchitecture:
    """PaliGemma + expert shapes: Gemma dims from the variant names, the rest from the tensors."""
    for field in ("paligemma_variant", "action_expert_variant"):
        if field not in config:
            raise UserError(f"config.json lacks {field!r}; it is not a pi0 / pi0.5 checkpoint config")
    embed = weights.get(EMBED_KEY, weights.get(LM_HEAD_KEY))
    if embed is None:
        raise UserError(
            f"the checkpoint has neither {EMBED_KEY} nor {LM_HEAD_KEY}: not a PaliGemma-based pi0"
        )
    vision = PALIGEMMA + "model.vision_tower.vision_model."
    patch = weights[vision + "embeddings.patch_embedding.weight"]  # [hidden, 3, p, p]
    num_patches = weights[vision + "embeddings.position_embedding.weight"].shape[0]
    layers = vision + "encoder.layers."
    depth = len({k[len(layers) :].split(".")[0] for k in weights if k.startswith(layers)})
    hidden, patch_size = patch.shape[0], patch.shape[-1]
    tower = VisionTowerConfig(
        "siglip",
        image_size=round(num_patches**0.5) * patch_size,
        patch_size=patch_size,
        hidden_size=hidden,
        num_layers=depth,
        num_heads=max(1, hidden // SIGLIP_HEAD_DIM),
        intermediate_size=weights[vision + "encoder.layers.0.mlp.fc1.weight"].shape[0],
    )
    vocab = embed.shape[0]
    return VLAArchitecture(
        vision_towers=(tower,),
        projector="linear",
        language=gemma_config(config["paligemma_variant"], vocab),
        action_expert=gemma_config(config["action_expert_variant"], vocab),
    )


def read_weights(src: Path, fmt: str) -> dict[str, torch.Tensor]:
    """model.safetensors with the lerobot `model.` prefix removed, after checking the prefix fits `fmt`."""
    path = src / "model.safetensors"
    if not path.is_file():
        raise UserError(f"{src} has no model.safetensors; point import_pi0 at the checkpoint folder")
    raw = load_file(str(path))
    prefixed = sum(k.startswith("model.") for k in raw)
    if fmt == "openpi" and prefixed == len(raw):
        raise UserError(f"{path}: every key starts with 'model.', the LeRobot layout; use fmt='lerobot'")
    if fmt == "lerobot" and prefixed == 0:
        raise UserError(f"{path}: no key starts with 'model.', the openpi layout; use fmt='openpi'")
    return {k.removeprefix(SOURCE_PREFIX[fmt]): v for k, v in raw.items()}


def detect_variant(weights: dict[str, torch.Tensor], config: dict, fmt: str) -> str:
    """pi0 or pi05 from the weights; a LeRobot config's "type" must agree."""
    variant = "pi05" if "time_mlp_in.weight" in weights else "pi0"
    declared = config.get("type") if fmt == "lerobot" else None
    if declared is not None and declared != variant:
        raise UserError(
            f"config.json says type={declared!r} but the weights are a {variant} "
            f"({'time_mlp_in + adaRMS norms' if variant == 'pi05' else 'state_proj + action_time_mlp'})"
        )
    return variant


def read_norm_stats(src: Path, fmt: str, asset_id: str | None) -> dict[str, dict[str, torch.Tensor]]:
    """{"action": {mean, std, q01, q99}, "state": {...} if present} from the layout's normalization files."""
    if fmt == "openpi":
        found = sorted(src.glob("assets/*/norm_stats.json")) + sorted(src.glob("norm_stats.json"))
        if asset_id is not None:
            found = [p for p in found if p.parent.name == asset_id]
        if len(found) != 1:
            raise UserError(
                f"{src}: expected one norm_stats.json (openpi keeps it in assets/<asset_id>/), found "
                f"{[str(p.relative_to(src)) for p in found] or 'none'}"
                + (
                    "; pick one with asset_id="
                    if len(found) > 1
                    else "; copy the training run's assets folder"
                )
            )
        data = json.loads(found[0].read_text()).get("norm_stats")
        if not isinstance(data, dict):
            raise UserError(f"{found[0]} has no 'norm_stats' mapping")
        flat = {f"{key}.{stat}": torch.tensor(v) for key, stats in data.items() for stat, v in stats.items()}
    else:
        found = sorted(src.glob("policy_preprocessor_step_*_normalizer_processor.safetensors"))
        if not found:
            raise UserError(
                f"{src} has no policy_preprocessor_step_*_normalizer_processor.safetensors: LeRobot "
                "saves the normalization stats there; copy them from the training run"
            )
        flat = load_file(str(found[0]))
    stats = {
        ours: {s: flat[f"{theirs}.{s}"].float() for s in STAT_NAMES if f"{theirs}.{s}" in flat}
        for ours, theirs in STATS_KEYS[fmt].items()
        if f"{theirs}.mean" in flat
    }
    if "action" not in stats:
        raise UserError(f"the normalization stats in {src} lack the action stats (keys: {sorted(flat)[:8]})")
    return stats


def map_weights(source: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Source tensors under our names, and the source keys that map to nothing."""
    mapped, unexpected = {}, []
    for key, value in source.items():
        ours = to_embodrl_key(key)
        if ours is not None:
            mapped[ours] = value
        elif key not in (LM_HEAD_KEY, EXPERT_LM_HEAD_KEY):
            unexpected.append(key)
    if EMBED_KEY not in source and LM_HEAD_KEY in source:  # openpi/LeRobot files keep the tied lm_head name
        mapped[to_embodrl_key(EMBED_KEY)] = source[LM_HEAD_KEY]
    return mapped, unexpected


def check_weights(policy: FlowPolicy, mapped: dict[str, torch.Tensor], unexpected: list[str]) -> None:
    """Every mapped parameter present with the right shape, nothing left over; else say what and why."""
    expected = {k: v.shape for k, v in policy.state_dict().items() if to_source_key(k) is not None}
    missing = sorted(set(expected) - set(mapped))
    wrong = [
        f"{to_source_key(k)} {list(v.shape)} (expected {list(expected[k])})"
        for k, v in mapped.items()
        if k in expected and v.shape != expected[k]
    ]
    unexpected = unexpected + [to_source_key(k) for k in sorted(set(mapped) - set(expected))]
    if not (missing or wrong or unexpected):
        return
    hint = "the checkpoint's shapes do not match its config.json variants"
    if any("time_mlp" in k or ".dense." in k or "state_proj" in k for k in [*missing, *unexpected]):
        hint = "pi0 and pi0.5 parts are mixed (time_mlp/adaRMS vs state_proj/action_time_mlp)"
    elif any(k.startswith("paligemma_with_expert.paligemma.language_model.") for k in unexpected):
        hint = "transformers < 4.52's PaliGemma key layout (language_model.model.*); re-convert with openpi"
    raise UserError(
        "pi0 checkpoint keys do not match the model: "
        + "; ".join(
            f"{what}: {items[:3]}{' ...' if len(items) > 3 else ''}"
            for what, items in (
                ("missing", [to_source_key(k) for k in missing]),
                ("unexpected", unexpected),
                ("wrong shape", wrong),
            )
            if items
        )
        + f". Likely cause: {hint}"
    )


def import_pi0(
    src_dir: str | Path,
    out_dir: str | Path | None = None,
    fmt: str = "openpi",
    *,
    tokenizer_dir: str | Path | None = None,
    obs_keys: tuple[str, ...] = (*IMAGE_KEYS, STATE),
    chunk_size: int | None = None,
    likelihood: str = "noise",
    num_steps: int = 10,
    asset_id: str | None = None,
) -> FlowPolicy:
    """Load a pi0 / pi0.5 checkpoint folder of layout `fmt` into a flow policy (saved to `out_dir` if given).

    The PaliGemma tokenizer is not part of these layouts: a tokenizer.json is read from `src_dir` or
    `tokenizer_dir`. State and action sizes come from the normalization stats; the expert keeps the
    checkpoint's padded action width and horizon, and `chunk_size` (default: the horizon) steps are executed.
    """
    if fmt not in FORMATS:
        raise UserError(f"fmt={fmt!r} is not a pi0 layout; choose one of: {', '.join(FORMATS)}")
    src = Path(src_dir)
    config_path = src / "config.json"
    if not config_path.is_file():
        raise UserError(f"{src} has no config.json; point import_pi0 at the checkpoint folder")
    config = json.loads(config_path.read_text())
    weights = read_weights(src, fmt)
    variant = detect_variant(weights, config, fmt)
    stats = read_norm_stats(src, fmt, asset_id)
    tokenizer_src = src if (src / "tokenizer.json").is_file() else tokenizer_dir
    if tokenizer_src is None:
        raise UserError(
            "pi0 checkpoints do not carry their PaliGemma tokenizer; pass tokenizer_dir=<folder with the "
            "PaliGemma tokenizer.json>"
        )
    architecture = architecture_from(config, weights)
    model_action_dim = weights["action_out_proj.weight"].shape[0]
    state_proj = weights.get("state_proj.weight")  # absent in a broken pi0: check_weights reports it
    state_width = PADDED_DIM if state_proj is None else state_proj.shape[1]
    horizon = int(config.get("action_horizon", config.get("chunk_size", 50)))
    action_dim = len(stats["action"]["mean"])
    state_dim = len(stats["state"]["mean"]) if "state" in stats else 0
    if "state" in obs_keys and not state_dim:
        raise UserError(f"obs_keys reads 'state' but {src} has no state normalization stats; drop 'state'")
    image_size = architecture.vision_towers[0].image_size
    # LeRobot's pi05 processor pads the state to max_state_dim before discretizing it into the prompt
    lerobot_pi05 = fmt == "lerobot" and variant == "pi05"
    prompt_state_dim = int(config.get("max_state_dim", PADDED_DIM)) if lerobot_pi05 else 0
    preset = next((name for name, arch in PRESETS.items() if arch == architecture), None)
    cfg = PolicyConfig(
        family="flow",
        chunk_size=chunk_size or horizon,
        action_dim=action_dim,
        obs_keys=tuple(obs_keys),
        state_normalization=NORMALIZATION[variant],
        action_normalization=NORMALIZATION[variant],
        flow=FlowConfig(
            conditioning="vla",
            vla_variant=variant,
            action_horizon=horizon,
            max_action_dim=model_action_dim,
            max_state_dim=state_width if variant == "pi0" else 0,
            likelihood=likelihood,
            num_steps=num_steps,
            clean_instruction=fmt != "lerobot",
            prompt_state_dim=prompt_state_dim,
        ),
        vla=VLAConfig(
            preset=preset or VLAConfig.preset,
            custom=None if preset else architecture,
            max_instruction_tokens=int(config.get("tokenizer_max_length", PROMPT_TOKENS[variant])),
        ),
    )
    shapes = {key: (image_size, image_size, 3) for key in obs_keys if key in IMAGE_KEYS}
    if state_dim:
        shapes["state"] = (state_dim,)
    policy = FlowPolicy(cfg, shapes)
    mapped, unexpected = map_weights(weights)
    check_weights(policy, mapped, unexpected)
    policy.load_state_dict(mapped, strict=False)
    policy.set_normalization(stats)
    policy.prefix_encoder.backbone.tokenizer = load_tokenizer(tokenizer_src)
    if out_dir is not None:
        policy.save_pretrained(out_dir)
    return policy


def export_pi0(policy: FlowPolicy | str | Path, out_dir: str | Path, fmt: str = "openpi") -> Path:
    """Write a VLA flow policy (or its checkpoint folder) back in layout `fmt`; returns the folder.

    Only the source layout's parameters are written: the RL likelihood head and the value head have no
    place in it. The tokenizer goes along (tokenizer.json) so `import_pi0` can read the folder back.
    """
    if fmt not in FORMATS:
        raise UserError(f"fmt={fmt!r} is not a pi0 layout; choose one of: {', '.join(FORMATS)}")
    if not isinstance(policy, FlowPolicy):
        policy = load_policy(policy)
    if not isinstance(policy, FlowPolicy) or policy.action_expert is None:
        raise UserError(
            "export_pi0 needs a flow policy with policy.flow.conditioning=vla (a pi0-style policy)"
        )
    cfg, out, prefix = policy.cfg, Path(out_dir), SOURCE_PREFIX[fmt]
    architecture = cfg.vla.architecture
    weights = {}
    for key, value in policy.state_dict().items():
        source = to_source_key(key)
        if source is not None:
            weights[prefix + (LM_HEAD_KEY if source == EMBED_KEY else source)] = (
                value.detach().cpu().contiguous()
            )
    # Zeros for the expert's unused lm_head, which openpi's strict loader expects.
    expert = expert_shape(architecture)
    weights[prefix + EXPERT_LM_HEAD_KEY] = torch.zeros(
        architecture.language.padded_vocab_size, expert.hidden_size
    )
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"))
    stats = {
        STATS_KEYS[fmt][key]: {s: getattr(norm, s).detach().cpu() for s in STAT_NAMES}
        for key, norm in policy.normalizers.items()
        if key in STATS_KEYS[fmt]
    }
    variant, (horizon, action_width) = cfg.flow.vla_variant, policy.model_shape
    config = {
        "paligemma_variant": variant_name(architecture.language),
        "action_expert_variant": variant_name(expert),
    }
    if fmt == "openpi":
        config |= {"action_dim": action_width, "action_horizon": horizon, "precision": "float32"}
        (out / "assets" / "embodrl").mkdir(parents=True, exist_ok=True)
        norm_stats = {k: {s: v.tolist() for s, v in st.items()} for k, st in stats.items()}
        (out / "assets" / "embodrl" / "norm_stats.json").write_text(
            json.dumps({"norm_stats": norm_stats}, indent=2)
        )
    else:
        config |= lerobot_config(policy, variant, horizon, action_width)
        flat = {f"{k}.{s}": v.contiguous() for k, st in stats.items() for s, v in st.items()}
        save_file(flat, str(out / "policy_preprocessor_step_0_normalizer_processor.safetensors"))
        save_file(flat, str(out / "policy_postprocessor_step_0_unnormalizer_processor.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    policy.prefix_encoder.backbone.tokenizer.save_pretrained(str(out))
    return out


def lerobot_config(policy: FlowPolicy, variant: str, horizon: int, action_width: int) -> dict:
    """The LeRobot PI0Config / PI05Config fields that describe this policy."""
    cfg = policy.cfg
    size = cfg.vla.architecture.vision_towers[0].image_size
    mode = "MEAN_STD" if cfg.action_normalization == "mean_std" else "QUANTILES"
    features = {
        f"observation.images.{key}": {"type": "VISUAL", "shape": [3, size, size]}
        for key in policy.prefix_encoder.image_keys
    }
    if policy.state_dim:
        features["observation.state"] = {"type": "STATE", "shape": [policy.state_dim]}
    return {
        "type": variant,
        "dtype": "float32",
        "chunk_size": horizon,
        "n_action_steps": cfg.chunk_size,
        "max_state_dim": policy.model_state_dim
        if variant == "pi0"
        else cfg.flow.prompt_state_dim or PADDED_DIM,
        "max_action_dim": action_width,
        "num_inference_steps": cfg.flow.num_steps,
        "tokenizer_max_length": cfg.vla.max_instruction_tokens,
        "image_resolution": [size, size],
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": mode, "ACTION": mode},
        "input_features": features,
        "output_features": {"action": {"type": "ACTION", "shape": [cfg.action_dim]}},
    }
