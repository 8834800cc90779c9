"""OpenVLA / OpenVLA-OFT checkpoints (Hugging Face layout) <-> the autoregressive family.

The source layout: `config.json` (Prismatic fields: use_fused_vision_backbone, timm_model_ids, image_sizes,
timm_override_act_layers, text_config, pad_to_multiple_of, n_action_bins), safetensors (sharded with
`model.safetensors.index.json`, or one `model.safetensors`) holding `vision_backbone.featurizer.*`
(+ `fused_featurizer.*`), `projector.fc1/fc2[/fc3]`, `language_model.model.*`, `language_model.lm_head`;
`dataset_statistics.json` ({dataset: {action: {q01, q99, mask}, proprio: {...}}}); the Llama tokenizer
files. OpenVLA-OFT adds `proprio_projector--*.pt` (fc1, GELU, fc2) and decodes the chunk in parallel.
Nothing is downloaded and no checkpoint code is run: the architecture is rebuilt from `transformers`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from embodrl.errors import UserError
from embodrl.obs_keys import IMAGE_KEYS
from embodrl.policies.autoregressive.modeling import AutoregressivePolicy
from embodrl.policies.config import PolicyConfig
from embodrl.policies.pretrained.timm_vit import UNUSED_PREFIXES, tower_from_timm, tower_to_timm
from embodrl.policies.vla.configuration import (
    PRESETS,
    LanguageModelConfig,
    VisionTowerConfig,
    VLAArchitecture,
)
from embodrl.policies.vla.tokenizer import load_tokenizer

# Prismatic's timm featurizers by id (exact GELU, features of the second-to-last block, as in OpenVLA).
TIMM_VISION_TOWERS: dict[str, VisionTowerConfig] = dict(
    zip(
        ("vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"),
        PRESETS["openvla-7b"].vision_towers,
        strict=True,
    )
)
TOWER_PREFIXES = ("vision_backbone.featurizer.", "vision_backbone.fused_featurizer.")
STATS_FILE = "dataset_statistics.json"
PROPRIO_PROJECTOR_GLOB = "proprio_projector--*.pt"
OURS_TOWER = "prefix_encoder.backbone.vision_towers.{}."
OURS_PROJECTOR = "prefix_encoder.backbone.projector."
OURS_LANGUAGE = "prefix_encoder.backbone.language_model."
OURS_STATE = "prefix_encoder.backbone.state_projection."
# Our parameters with no OpenVLA counterpart: initialised fresh (critic) or set from the statistics.
NEW_PREFIXES = ("critic.", "value_encoder.", "normalizers.", "slot_embeddings")


def read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise UserError(f"{path.parent} has no {path.name}; it is not {what}")
    return json.loads(path.read_text())


def architecture_from_config(config: dict) -> VLAArchitecture:
    """The VLAArchitecture an OpenVLA config.json describes (text_config completed by LlamaConfig defaults,
    as OpenVLA's own configuration class does)."""
    from transformers import LlamaConfig

    ids, sizes = list(config["timm_model_ids"]), list(config["image_sizes"])
    fused = bool(config["use_fused_vision_backbone"])
    if len(ids) != (2 if fused else 1) or len(sizes) != len(ids):
        raise UserError(f"config.json lists timm_model_ids={ids} and image_sizes={sizes} for fused={fused}")
    unknown = [i for i in ids if i not in TIMM_VISION_TOWERS]
    overrides = [a for a in config.get("timm_override_act_layers", [None] * len(ids)) if a is not None]
    if unknown or overrides:
        raise UserError(
            f"unsupported vision backbone {unknown or overrides} in config.json; supported timm ids: "
            f"{sorted(TIMM_VISION_TOWERS)} without activation overrides"
        )
    towers = tuple(
        dataclasses.replace(TIMM_VISION_TOWERS[i], image_size=int(s)) for i, s in zip(ids, sizes, strict=True)
    )
    text = LlamaConfig(**{k: v for k, v in config["text_config"].items() if k != "model_type"})
    if config["text_config"].get("model_type", "llama") != "llama":
        raise UserError("only Llama language models are supported (OpenVLA's llama2-7b-pure)")
    rows = int(text.vocab_size)
    language = LanguageModelConfig(
        "llama",
        hidden_size=text.hidden_size,
        num_layers=text.num_hidden_layers,
        num_heads=text.num_attention_heads,
        num_kv_heads=text.num_key_value_heads,
        head_dim=text.hidden_size // text.num_attention_heads,
        intermediate_size=text.intermediate_size,
        vocab_size=rows - int(config.get("pad_to_multiple_of", 0)),
        embedding_rows=rows,
        max_positions=text.max_position_embeddings,
        rms_norm_eps=text.rms_norm_eps,
    )
    return VLAArchitecture(towers, "fused_gelu_mlp" if fused else "mlp", language, state_projector="mlp")


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a single-file or sharded (index.json) safetensors checkpoint."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise UserError(
                f"{directory} lacks shards {missing} listed in {index.name}; the copy is incomplete"
            )
        return {k: v for shard in shards for k, v in load_file(str(directory / shard)).items()}
    if (directory / "model.safetensors").is_file():
        return load_file(str(directory / "model.safetensors"))
    raise UserError(f"{directory} has neither model.safetensors nor model.safetensors.index.json")


def read_action_stats(directory: Path, config: dict, unnorm_key: str | None) -> tuple[str, dict]:
    """(dataset key, its statistics) from dataset_statistics.json (or config.json's norm_stats)."""
    path = directory / STATS_FILE
    stats = json.loads(path.read_text()) if path.is_file() else config.get("norm_stats")
    if not stats:
        raise UserError(
            f"{directory} has no {STATS_FILE} (nor norm_stats in config.json): the action un-normalization "
            "statistics (q01/q99 per dataset) are needed; copy the file from the checkpoint's source"
        )
    if unnorm_key is None and len(stats) != 1:
        raise UserError(f"the checkpoint has statistics for {sorted(stats)}; choose one with unnorm_key")
    key = unnorm_key if unnorm_key is not None else next(iter(stats))
    if key not in stats:
        raise UserError(f"unnorm_key {key!r} is not in {sorted(stats)}")
    return key, stats[key]


def quantile_stats(stats: dict) -> dict[str, torch.Tensor]:
    """OpenVLA BOUNDS_Q99 stats -> our quantile normalizer; masked dims (e.g. the gripper) pass through,
    which q01 = -1, q99 = +1 reproduces."""
    q01, q99 = torch.tensor(stats["q01"]), torch.tensor(stats["q99"])
    mask = torch.tensor(stats.get("mask", [True] * len(q01)), dtype=torch.bool)
    return {"q01": torch.where(mask, q01, -1.0), "q99": torch.where(mask, q99, 1.0)}


def proprio_projector_file(directory: Path) -> Path | None:
    files = sorted(directory.glob(PROPRIO_PROJECTOR_GLOB))
    return files[-1] if files else None


class ReadRecorder(dict):
    """A dict that remembers which keys were read, so unread (unexpected) source keys can be reported."""

    def __init__(self, data: dict) -> None:
        super().__init__(data)
        self.read: set[str] = set()

    def __getitem__(self, key: str):
        self.read.add(key)
        return super().__getitem__(key)


def map_from_openvla(source: dict[str, torch.Tensor], arch: VLAArchitecture) -> tuple[dict, list[str]]:
    """OpenVLA state dict -> ours, and the source keys nothing consumed (unexpected)."""
    ours: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for i, (tower, prefix) in enumerate(zip(arch.vision_towers, TOWER_PREFIXES, strict=False)):
        sub = ReadRecorder({k.removeprefix(prefix): v for k, v in source.items() if k.startswith(prefix)})
        try:
            mapped = tower_from_timm(tower, sub)
        except KeyError as error:
            raise UserError(
                f"the checkpoint lacks {prefix}{error.args[0]}: {mismatch_hint(source)}"
            ) from None
        ours.update({OURS_TOWER.format(i) + k: v for k, v in mapped.items()})
        used.update(prefix + k for k in sub if k in sub.read or k.startswith(UNUSED_PREFIXES))
    layers = [0, 2, 4] if arch.projector == "fused_gelu_mlp" else [0, 2]
    for fc, layer in enumerate(layers, start=1):
        for p in ("weight", "bias"):
            ours[f"{OURS_PROJECTOR}{layer}.{p}"] = source.get(f"projector.fc{fc}.{p}")
            used.add(f"projector.fc{fc}.{p}")
    for key, value in source.items():
        if key.startswith("language_model.model."):
            ours[OURS_LANGUAGE + key.removeprefix("language_model.model.")] = value
            used.add(key)
    ours["lm_head.weight"] = source.get("language_model.lm_head.weight")
    used.add("language_model.lm_head.weight")
    return {k: v for k, v in ours.items() if v is not None}, [k for k in source if k not in used]


def mismatch_hint(keys) -> str:
    """A likely cause for keys that do not match the OpenVLA layout."""
    keys = list(keys)
    if any("lora_" in k or k.startswith("base_model.") for k in keys):
        return "this is a peft LoRA adapter, not a merged model: merge it first (embodrl convert merge-lora)"
    if any(k.startswith("module.") for k in keys):
        return "keys carry DDP's 'module.' prefix: save the unwrapped model"
    if any(k.endswith(".gamma") for k in keys):
        return "LayerScale keys are timm's raw 'gamma': a native Prismatic checkpoint, convert it to HF first"
    return "config.json does not describe these weights (other layer counts, backbone ids or model family)"


def check_keys(expected: set[str], mapped: dict, unexpected: list[str]) -> None:
    """Raise a UserError naming the first missing and unexpected keys and a likely cause."""
    missing = sorted(k for k in expected - set(mapped) if not k.startswith(NEW_PREFIXES))
    extra = sorted(k.replace(OURS_LANGUAGE, "language_model.model.") for k in set(mapped) - expected)
    unexpected = unexpected + extra
    if missing or unexpected:
        raise UserError(
            f"the checkpoint does not match its config: missing {missing[:5]} ({len(missing)} in all), "
            f"unexpected {unexpected[:5]} ({len(unexpected)} in all); likely cause: "
            f"{mismatch_hint(unexpected or missing)}"
        )


def import_openvla(
    directory: str | Path,
    *,
    decoding: str = "sequential",
    chunk_size: int = 1,
    action_dim: int | None = None,
    unnorm_key: str | None = None,
    max_prompt_tokens: int = 64,
    device: str = "cpu",
) -> AutoregressivePolicy:
    """An OpenVLA checkpoint folder as an AutoregressivePolicy (OpenVLA-OFT: decoding="oft", the chunk
    size it was trained with, and its proprio projector file next to the weights, read as `state`)."""
    directory = Path(directory)
    config = read_json(directory / "config.json", "an OpenVLA checkpoint")
    arch = architecture_from_config(config)
    key, stats = read_action_stats(directory, config, unnorm_key)
    dims = len(stats["action"]["q01"])
    if action_dim is not None and action_dim != dims:
        raise UserError(
            f"the checkpoint's actions have {dims} dims ({key!r} statistics) but {action_dim} were asked "
            "for; use an env with the same action space or fine-tune a new checkpoint"
        )
    if any(directory.glob("action_head--*.pt")):
        raise UserError(
            f"{directory} holds an OFT continuous action head (action_head--*.pt: L1 or diffusion), "
            "which has no likelihood for RL; import a discrete-token OFT checkpoint (256-bin tokens) instead"
        )
    proprio = proprio_projector_file(directory)
    proprio_state = {}
    if proprio is not None:
        loaded = torch.load(proprio, map_location="cpu", weights_only=True)
        proprio_state = {k.removeprefix("module."): v for k, v in loaded.items()}
    images = IMAGE_KEYS[: int(config.get("num_images_in_input", 1))]
    size = arch.vision_towers[0].image_size
    shapes = {k: (size, size, 3) for k in images}
    if proprio_state:
        shapes["state"] = (proprio_state["fc1.weight"].shape[1],)
    cfg = PolicyConfig.from_dict(
        {
            "family": "autoregressive",
            "chunk_size": chunk_size,
            "action_dim": dims,
            "obs_keys": list(shapes),
            "state_normalization": "quantile",
            "action_normalization": "quantile",
            "autoregressive": {"decoding": decoding},
            "vla": {
                "custom": dataclasses.asdict(arch),
                "prompt_format": "openvla",
                "max_instruction_tokens": max_prompt_tokens,
            },
        }
    )
    policy = AutoregressivePolicy(cfg, shapes, device=device)
    mapped, unexpected = map_from_openvla(read_weights(directory), arch)
    layer = {"fc1": 0, "fc2": 2}  # OFT's ProprioProjector (fc1, GELU, fc2) -> our nn.Sequential indices
    for key, value in proprio_state.items():
        fc, param = key.split(".")
        mapped[f"{OURS_STATE}{layer[fc]}.{param}"] = value
    check_keys(set(policy.state_dict()), mapped, unexpected)
    try:
        policy.load_state_dict(mapped, strict=False)
    except RuntimeError as error:  # shape mismatches
        raise UserError(f"checkpoint tensors do not fit config.json: {str(error)[:600]}") from None
    policy.set_normalization({"action": quantile_stats(stats["action"])})
    if proprio_state and "proprio" in stats:
        policy.set_normalization({"state": quantile_stats(stats["proprio"])})
    policy.prefix_encoder.backbone.tokenizer = load_tokenizer(directory)
    return policy


def export_openvla(policy: AutoregressivePolicy, directory: str | Path, unnorm_key: str = "embodrl") -> None:
    """Write `policy` in the OpenVLA(-OFT) layout that `import_openvla` (and OpenVLA's tools) read."""
    arch = policy.cfg.vla.architecture
    ids = [_timm_id(t) for t in arch.vision_towers]
    if arch.language.model_type != "llama" or arch.projector == "linear" or policy.decoding == "parallel":
        raise UserError(
            "only OpenVLA-shaped policies (timm towers, MLP projector, Llama; sequential or oft decoding, "
            "not learned parallel slots) can be exported to the OpenVLA layout"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ours = {k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    for i, (tower, prefix) in enumerate(zip(arch.vision_towers, TOWER_PREFIXES, strict=False)):
        head = OURS_TOWER.format(i)
        sub = {k.removeprefix(head): v for k, v in ours.items() if k.startswith(head)}
        out.update({prefix + k: v for k, v in tower_to_timm(tower, sub).items()})
    layers = [0, 2, 4] if arch.projector == "fused_gelu_mlp" else [0, 2]
    for fc, layer in enumerate(layers, start=1):
        for p in ("weight", "bias"):
            out[f"projector.fc{fc}.{p}"] = ours[f"{OURS_PROJECTOR}{layer}.{p}"]
    for key, value in ours.items():
        if key.startswith(OURS_LANGUAGE):
            out["language_model.model." + key.removeprefix(OURS_LANGUAGE)] = value
    out["language_model.lm_head.weight"] = ours["lm_head.weight"]
    save_file(out, str(directory / "model.safetensors"))
    if policy.backbone.state_projection is not None:
        proprio = {
            f"fc{i // 2 + 1}.{p}": ours[f"{OURS_STATE}{i}.{p}"] for i in (0, 2) for p in ("weight", "bias")
        }
        torch.save(proprio, directory / "proprio_projector--0_checkpoint.pt")
    stats = {"action": _bounds_stats(policy.normalizers["action"])}
    if "state" in policy.normalizers:
        stats["proprio"] = _bounds_stats(policy.normalizers["state"])
    (directory / STATS_FILE).write_text(json.dumps({unnorm_key: stats}, indent=2))
    language = arch.language
    config = {
        "model_type": "openvla",
        "use_fused_vision_backbone": len(ids) == 2,
        "timm_model_ids": ids,
        "image_sizes": [t.image_size for t in arch.vision_towers],
        "timm_override_act_layers": [None] * len(ids),
        "num_images_in_input": len([k for k in policy.cfg.obs_keys if k in IMAGE_KEYS]),
        "pad_to_multiple_of": language.padded_vocab_size - language.vocab_size,
        "n_action_bins": 256,
        "text_config": {
            "model_type": "llama",
            "vocab_size": language.padded_vocab_size,
            "hidden_size": language.hidden_size,
            "intermediate_size": language.intermediate_size,
            "num_hidden_layers": language.num_layers,
            "num_attention_heads": language.num_heads,
            "num_key_value_heads": language.num_kv_heads,
            "max_position_embeddings": language.max_positions,
            "rms_norm_eps": language.rms_norm_eps,
        },
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    policy.backbone.tokenizer.save_pretrained(str(directory))


def _timm_id(tower: VisionTowerConfig) -> str:
    for timm_id, known in TIMM_VISION_TOWERS.items():
        if dataclasses.replace(known, image_size=tower.image_size) == tower:
            return timm_id
    raise UserError(
        f"vision tower {tower} is none of OpenVLA's timm featurizers {sorted(TIMM_VISION_TOWERS)}"
    )


def _bounds_stats(normalizer) -> dict[str, list]:
    """Our quantile stats as OpenVLA's; dims with q01 = -1 and q99 = +1 are exported as masked."""
    q01, q99 = normalizer.q01.cpu(), normalizer.q99.cpu()
    mask = ~((q01 == -1.0) & (q99 == 1.0))
    return {"q01": q01.tolist(), "q99": q99.tolist(), "mask": mask.tolist()}
