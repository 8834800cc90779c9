"""The shared VLA prefix: shapes, masks, image checks, and full-size presets built on the meta device."""

import dataclasses

import pytest
import torch

from embodrl.errors import ConfigError, UserError
from embodrl.policies.vla.configuration import PRESETS, VLAConfig
from embodrl.policies.vla.modeling import VLABackbone, build_language_model, pool, prefix_lm_mask
from embodrl.policies.vla.tokenizer import train_tokenizer
from tests.policies.vla_testing import INSTRUCTIONS, N, S, make_obs


@pytest.fixture(scope="module")
def backbone():
    torch.manual_seed(0)
    cfg = VLAConfig(instructions=INSTRUCTIONS)
    tokenizer = train_tokenizer(cfg.instructions, cfg.tokenizer_vocab_size)
    return VLABackbone(cfg.architecture, ("rgb", "wrist_rgb"), S, tokenizer, cfg.max_instruction_tokens)


def test_nano_prefix_layout_and_size(backbone):
    arch = PRESETS["nano"]
    params = sum(p.numel() for p in backbone.parameters())
    assert 0.5e6 < params < 5e6  # "a few M"
    prefix = backbone.embed_prefix(make_obs(), torch.randn(N, S))
    patches = arch.vision_towers[0].num_patches
    assert prefix.embeds.shape == (N, 2 * patches + 16 + 1, arch.language.hidden_size)
    assert prefix.mask[:, : 2 * patches].all() and prefix.mask[:, -1].all()  # images and state are real
    assert not prefix.mask.all()  # short instructions are padded
    hidden = backbone(prefix.embeds, prefix.mask.long()).last_hidden_state
    assert pool(hidden, prefix.mask).shape == (N, 2 * arch.language.hidden_size)


def test_slots_do_not_change_the_prefix_and_see_each_other(backbone):
    prefix = backbone.embed_prefix(make_obs(), torch.randn(N, S))
    causal = backbone(prefix.embeds, prefix.mask.long()).last_hidden_state
    slots = torch.randn(N, 3, backbone.hidden_size)
    mask = prefix_lm_mask(prefix.mask, 3)
    with_slots = backbone(torch.cat([prefix.embeds, slots], 1), mask).last_hidden_state
    torch.testing.assert_close(with_slots[:, :-3][prefix.mask], causal[prefix.mask], atol=1e-5, rtol=1e-5)
    assert mask[0, 0, -3, -1] and not mask[0, 0, 0, 1]  # slots bidirectional, prefix causal
    changed = slots.clone()
    changed[:, -1] += 1.0  # the first slot must see the last one
    other = backbone(torch.cat([prefix.embeds, changed], 1), mask).last_hidden_state
    assert not torch.allclose(other[:, -3], with_slots[:, -3])


@pytest.mark.parametrize("model_type", ["qwen2", "gemma"])
def test_other_language_model_types_run(model_type):
    nano = PRESETS["nano"]
    arch = dataclasses.replace(nano, language=dataclasses.replace(nano.language, model_type=model_type))
    tokenizer = train_tokenizer(INSTRUCTIONS, 300)
    backbone = VLABackbone(arch, ("rgb",), S, tokenizer)
    assert type(backbone.language_model).__name__.lower().startswith(model_type)
    prefix = backbone.embed_prefix(make_obs(), torch.randn(N, S))
    hidden = backbone(prefix.embeds, prefix_lm_mask(prefix.mask, 0)).last_hidden_state
    assert hidden.shape == (*prefix.mask.shape, arch.language.hidden_size) and torch.isfinite(hidden).all()


def test_wrong_image_size_and_missing_instruction_are_user_errors(backbone):
    obs = make_obs()
    del obs["instruction"]
    with pytest.raises(UserError, match="instruction"):
        backbone.embed_prefix(obs, torch.randn(N, S))
    obs = make_obs()
    del obs[backbone.image_keys[0]]
    with pytest.raises(UserError, match=f"lacks camera '{backbone.image_keys[0]}'"):
        backbone.embed_prefix(obs, torch.randn(N, S))
    with pytest.raises(UserError, match="64x64.*policy.vla.image_size=32"):
        backbone.encode_images(torch.zeros(2, 32, 32, 3, dtype=torch.uint8))


def test_config_rejects_bad_preset_and_vocab():
    with pytest.raises(ConfigError, match="preset"):
        VLAConfig(preset="gpt5")
    with pytest.raises(ConfigError, match="tokenizer_vocab_size"):
        VLAConfig(tokenizer_vocab_size=1000)  # nano has 1024 ids: 256 must stay free for actions


def test_tower_geometry_overrides_the_preset_and_is_checked():
    towers = VLAConfig(image_size=128, patch_size=16).architecture.vision_towers
    assert [(t.image_size, t.patch_size, t.num_patches) for t in towers] == [(128, 16, 64)]
    assert VLAConfig(image_size=128).architecture.vision_towers[0].num_patches == 256  # nano's 8 px patches
    assert VLAConfig().architecture == PRESETS["nano"]
    with pytest.raises(ConfigError, match="multiple of the patch size"):
        VLAConfig(image_size=100)
    with pytest.raises(ConfigError, match=">= 0"):
        VLAConfig(patch_size=-8)
    with pytest.raises(ConfigError, match="imported checkpoint"):
        VLAConfig(custom=PRESETS["nano"], image_size=128)


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_openvla_preset_matches_openvla_7b_on_meta():
    arch = PRESETS["openvla-7b"]
    with torch.device("meta"):
        backbone = VLABackbone(arch, ("rgb",), state_dim=0)
    lm_head = arch.language.hidden_size * arch.language.padded_vocab_size  # untied, as in Llama-2
    total = _count(backbone) + lm_head
    assert 7.3e9 < total < 7.7e9  # OpenVLA-7B: 7.54B
    assert 0.6e9 < _count(backbone.vision_towers) < 0.8e9  # DINOv2 ViT-L + SigLIP SO400M
    assert backbone.language_model.embed_tokens.weight.shape == (32064, 4096)


def test_pi0_preset_matches_pi0_on_meta():
    arch = PRESETS["pi0-3b"]
    with torch.device("meta"):
        backbone = VLABackbone(arch, ("rgb", "wrist_rgb"), state_dim=8)
        expert = build_language_model(arch.action_expert, with_embeddings=False)
    assert 0.25e9 < _count(expert) < 0.35e9  # Gemma-300M action expert
    assert 3.1e9 < _count(backbone) + _count(expert) < 3.5e9  # pi0: ~3.3B
    assert backbone.language_model.config.num_key_value_heads == 1  # Gemma-2B multi-query attention


def test_instruction_film_starts_as_the_identity_then_makes_image_tokens_depend_on_the_instruction(backbone):
    cfg = VLAConfig(instructions=INSTRUCTIONS, instruction_film=True)
    torch.manual_seed(0)  # the same weights as the fixture's backbone, plus the zero FiLM
    cameras = ("rgb", "wrist_rgb")
    film = VLABackbone(cfg.architecture, cameras, S, backbone.tokenizer, 16, instruction_film=True)
    obs, state = make_obs(), torch.randn(N, S)
    patches = 2 * PRESETS["nano"].vision_towers[0].num_patches
    torch.testing.assert_close(film.embed_prefix(obs, state).embeds, backbone.embed_prefix(obs, state).embeds)
    torch.nn.init.normal_(film.film.linear.weight, std=0.1)
    other = obs.clone()
    other["instruction"] = list(reversed(obs["instruction"]))  # the same images under other instructions
    first, second = film.embed_prefix(obs, state).embeds, film.embed_prefix(other, state).embeds
    assert not torch.allclose(first[:, :patches], second[:, :patches])  # both cameras' tokens modulated
    assert not torch.allclose(first[:, patches // 2 : patches], second[:, patches // 2 : patches])
    same = [i for i in range(N) if obs["instruction"][i] == other["instruction"][i]]
    torch.testing.assert_close(first[same, :patches], second[same, :patches])
    assert film.film.linear.weight.requires_grad
