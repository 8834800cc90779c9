"""pi0 / pi0.5 import and export: velocity parity with an independent reference forward, exact round trips,
full-size shapes on the meta device, and the errors a user meets with a wrong folder."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tensordict import TensorDict
from transformers import PreTrainedTokenizerFast

from embodrl.errors import UserError
from embodrl.policies.config import PolicyConfig
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.flow.modeling import FlowPolicy
from embodrl.policies.loading import load_policy
from embodrl.policies.pretrained.pi0 import architecture_from, export_pi0, import_pi0, to_source_key
from embodrl.policies.vla.configuration import PRESETS, VLAConfig
from tests.policies.pretrained.pi0_testing import (
    ACTION_DIM,
    EX,
    HORIZON,
    IMAGE,
    INSTRUCTIONS,
    MODEL_DIM,
    PG,
    STATE_DIM,
    reference_velocity,
    tiny_stats,
    write_checkpoint,
)
from tests.policies.vla_testing import build

N = 3


def make_obs(seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    obs = TensorDict(
        {
            "rgb": torch.randint(0, 256, (N, IMAGE, IMAGE, 3), generator=g, dtype=torch.uint8),
            "wrist_rgb": torch.randint(0, 256, (N, IMAGE, IMAGE, 3), generator=g, dtype=torch.uint8),
            "state": torch.randn(N, STATE_DIM, generator=g) * 2,
        },
        batch_size=[N],
    )
    obs["instruction"] = [INSTRUCTIONS[i % 2] for i in range(N)]
    return obs


def reference_inputs(src, variant: str, fmt: str, obs: TensorDict, max_tokens: int):
    """Images in [-1, 1], prompt token ids and the padded normalized state, built here from openpi's rules
    (LeRobot's for fmt="lerobot": the pi0 instruction as given, the pi05 state zero-padded to 32 first)."""
    stats = {k: {s: np.asarray(v) for s, v in st.items()} for k, st in tiny_stats().items()}["state"]
    state = obs["state"].numpy().astype(np.float64)
    if variant == "pi0":
        normed = (state - stats["mean"]) / (stats["std"] + 1e-6)
    else:
        normed = (state - stats["q01"]) / (stats["q99"] - stats["q01"] + 1e-6) * 2 - 1
    texts = [t.strip().replace("_", " ").replace("\n", " ") for t in obs["instruction"]]
    if variant == "pi0":
        prompts = [f"{t}\n" for t in (obs["instruction"] if fmt == "lerobot" else texts)]
    else:
        shown = np.pad(normed, ((0, 0), (0, 32 - STATE_DIM))) if fmt == "lerobot" else normed
        bins = np.digitize(shown, bins=np.linspace(-1, 1, 257)[:-1]) - 1
        prompts = [
            f"Task: {t}, State: {' '.join(map(str, b))};\nAction: " for t, b in zip(texts, bins, strict=True)
        ]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(src), local_files_only=True)
    enc = tokenizer(
        prompts, padding="max_length", truncation=True, max_length=max_tokens, return_tensors="pt"
    )
    images = [obs[k].permute(0, 3, 1, 2).float() / 255 * 2 - 1 for k in ("rgb", "wrist_rgb")]
    padded = torch.zeros(N, 32)
    padded[:, :STATE_DIM] = torch.tensor(normed, dtype=torch.float32)
    return images, enc["input_ids"], enc["attention_mask"].bool(), padded


@pytest.mark.parametrize("fmt", ["openpi", "lerobot"])
@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_imported_velocity_matches_the_reference_forward(tmp_path, variant, fmt):
    weights = write_checkpoint(tmp_path, variant, fmt)
    policy = import_pi0(tmp_path, fmt=fmt, chunk_size=4)
    assert policy.model_shape == (HORIZON, MODEL_DIM) and policy.cfg.flow.vla_variant == variant
    obs = make_obs()
    g = torch.Generator().manual_seed(1)
    x_t, t = torch.randn(N, HORIZON, MODEL_DIM, generator=g), torch.rand(N, generator=g)
    with torch.no_grad():
        ours = policy.condition(obs)[1](x_t, t)
        changed = obs.clone()
        changed["rgb"] = 255 - changed["rgb"]
        other = policy.condition(changed)[1](x_t, t)
    inputs = reference_inputs(tmp_path, variant, fmt, obs, policy.cfg.vla.max_instruction_tokens)
    expected = reference_velocity(weights, variant, *inputs, x_t, t)
    assert expected.abs().mean() > 0.1  # a real signal, not two zeros
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    assert (other - ours).abs().max() > 1e-3  # the expert sees the images through the prefix cache


@pytest.mark.parametrize("variant", ["pi0", "pi05"])
def test_export_then_import_round_trips_exactly_in_both_layouts(tmp_path, variant):
    source = write_checkpoint(tmp_path / "src", variant, "openpi")
    first = import_pi0(tmp_path / "src", fmt="openpi")
    export_pi0(first, tmp_path / "lerobot", fmt="lerobot")
    second = import_pi0(tmp_path / "lerobot", fmt="lerobot")
    ours = second.state_dict()
    for key, value in first.state_dict().items():
        if to_source_key(key) is not None or key.startswith("normalizers."):
            assert torch.equal(value, ours[key]), key
    export_pi0(second, tmp_path / "openpi", fmt="openpi")
    written = load_file(str(tmp_path / "openpi" / "model.safetensors"))
    assert set(written) == set(source)
    for key, value in source.items():
        if key != EX + "lm_head.weight":  # unused by pi0: written as zeros
            assert torch.equal(written[key], value), key
    stats = json.loads((tmp_path / "openpi" / "assets" / "embodrl" / "norm_stats.json").read_text())
    np.testing.assert_allclose(
        stats["norm_stats"]["actions"]["q99"], tiny_stats()["action"]["q99"], rtol=1e-6
    )


@pytest.mark.parametrize("likelihood", ["noise", "sde"])
def test_imported_policy_acts_evaluates_with_ratio_one_and_reloads(tmp_path, likelihood):
    write_checkpoint(tmp_path / "src", "pi0", "lerobot")
    policy = import_pi0(
        tmp_path / "src", tmp_path / "ours", fmt="lerobot", likelihood=likelihood, chunk_size=4, num_steps=3
    )
    obs = make_obs()
    torch.manual_seed(1)
    out = policy.act(obs)
    assert out.actions.shape == (N, 4, ACTION_DIM) and out.logprob.shape == (N, 4, ACTION_DIM)
    assert out.replay["chain"].shape == (N, 4, HORIZON, MODEL_DIM)
    assert torch.equal(policy.evaluate(obs, out.replay).logprob, out.logprob)
    loaded = load_policy(tmp_path / "ours")
    torch.manual_seed(1)
    assert torch.equal(loaded.act(obs).actions, out.actions)


def test_missing_norm_stats_and_tokenizer_are_reported(tmp_path):
    write_checkpoint(tmp_path / "a", "pi0", "openpi")
    shutil.rmtree(tmp_path / "a" / "assets")
    with pytest.raises(UserError, match="norm_stats.json"):
        import_pi0(tmp_path / "a")
    write_checkpoint(tmp_path / "b", "pi0", "lerobot")
    (tmp_path / "b" / "policy_preprocessor_step_5_normalizer_processor.safetensors").unlink()
    with pytest.raises(UserError, match="normalizer_processor"):
        import_pi0(tmp_path / "b", fmt="lerobot")
    write_checkpoint(tmp_path / "c", "pi0", "openpi")
    (tmp_path / "c" / "tokenizer.json").unlink()
    with pytest.raises(UserError, match="tokenizer_dir"):
        import_pi0(tmp_path / "c")
    with pytest.raises(UserError, match="use fmt='openpi'"):
        import_pi0(tmp_path / "c", fmt="lerobot")


def test_mismatched_keys_name_the_first_missing_and_unexpected_keys_and_a_cause(tmp_path):
    weights = write_checkpoint(tmp_path, "pi0", "openpi")
    del weights["action_in_proj.bias"]
    weights["bogus.weight"] = torch.zeros(1)
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        UserError, match=r"missing: \['action_in_proj.bias'\].*unexpected: \['bogus.weight'\]"
    ):
        import_pi0(tmp_path)
    del weights["bogus.weight"], weights["state_proj.weight"], weights["state_proj.bias"]
    weights["action_in_proj.bias"] = torch.zeros(64)
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="state_proj.*pi0 and pi0.5 parts are mixed"):
        import_pi0(tmp_path)
    weights[PG + "model.language_model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    weights["state_proj.weight"], weights["state_proj.bias"] = torch.zeros(64, 32), torch.zeros(64)
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match=r"wrong shape.*up_proj.weight \[3, 3\]"):
        import_pi0(tmp_path)


def test_full_size_pi0_builds_on_the_meta_device_with_openpi_shapes():
    cfg = PolicyConfig(
        family="flow",
        chunk_size=50,
        action_dim=7,
        obs_keys=("rgb", "wrist_rgb", "state"),
        flow=FlowConfig(conditioning="vla", action_horizon=50, max_action_dim=32, max_state_dim=32),
        vla=VLAConfig(preset="pi0-3b", max_instruction_tokens=48),
    )
    shapes = {"rgb": (224, 224, 3), "wrist_rgb": (224, 224, 3), "state": (8,)}
    with torch.device("meta"):
        policy = FlowPolicy(cfg, shapes, device="meta")
    source = {to_source_key(k): v for k, v in policy.state_dict().items() if to_source_key(k) is not None}
    total = sum(v.numel() for v in source.values())
    assert 3.2e9 < total < 3.4e9, total  # PaliGemma 3B + Gemma 300M expert (without the unused lm_heads)
    assert source["action_in_proj.weight"].shape == (1024, 32)
    assert source["state_proj.weight"].shape == (1024, 32)
    assert source[EX + "model.layers.17.self_attn.q_proj.weight"].shape == (2048, 1024)
    assert source[EX + "model.layers.17.self_attn.k_proj.weight"].shape == (256, 1024)
    source[PG + "lm_head.weight"] = source.pop(PG + "model.language_model.embed_tokens.weight")
    variants = {"paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m"}
    assert architecture_from(variants, source) == PRESETS["pi0-3b"]


def test_export_refuses_policies_without_an_openpi_shape(tmp_path):
    with pytest.raises(UserError, match="none of openpi's variants"):
        export_pi0(build("flow", flow={"conditioning": "vla"}), tmp_path)
    with pytest.raises(UserError, match="conditioning=vla"):
        export_pi0(build("flow", obs_keys=("state",)), tmp_path)
