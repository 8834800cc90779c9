"""OpenVLA / OpenVLA-OFT import: logits parity with a reference forward, export round trip, bad input."""

import json

import pytest
import torch
from tensordict import TensorDict

from embodrl.errors import UserError
from embodrl.policies.loading import load_policy
from embodrl.policies.pretrained.openvla import (
    TIMM_VISION_TOWERS,
    architecture_from_config,
    export_openvla,
    import_openvla,
)
from embodrl.policies.vla.modeling import VLABackbone
from tests.policies.pretrained import openvla_testing as tiny


@pytest.fixture(autouse=True)
def tiny_towers(monkeypatch):
    for timm_id, tower in tiny.TOWERS.items():
        monkeypatch.setitem(TIMM_VISION_TOWERS, timm_id, tower)


def make_obs(n: int, image_keys=("rgb",), seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    shape = (n, tiny.IMAGE, tiny.IMAGE, 3)
    data = {k: torch.randint(0, 256, shape, generator=g, dtype=torch.uint8) for k in image_keys}
    data["state"] = torch.rand(n, tiny.STATE_DIM, generator=g) * 2 - 0.5
    obs = TensorDict(data, batch_size=[n])
    obs["instruction"] = [tiny.INSTRUCTIONS[i % len(tiny.INSTRUCTIONS)] for i in range(n)]
    return obs


def action_rows(logits: torch.Tensor) -> torch.Tensor:
    return logits[..., tiny.VOCAB - 256 : tiny.VOCAB]


def test_openvla_logits_match_the_reference_forward(tmp_path):
    weights = tiny.write_checkpoint(tmp_path)
    policy = import_openvla(tmp_path, chunk_size=2)
    tokenizer = policy.backbone.tokenizer
    obs = make_obs(2)  # two instructions of different lengths: left padding must not move positions
    index = torch.randint(0, 256, (2, 2 * tiny.ACTION_DIM), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, _, _ = policy._teacher_forced_logits(obs, index)
    for i in range(2):
        tokens = policy.action_tokenizer.to_token(index[i])
        expected = tiny.reference_openvla_logits(
            weights, tokenizer, obs["rgb"][i], obs["instruction"][i], tokens
        )
        torch.testing.assert_close(ours[i], action_rows(expected), atol=1e-4, rtol=1e-4)
    # sequential decoding (KV cache, positions past the padding) picks the reference's greedy tokens
    out = policy.act(obs[:1], deterministic=True)
    greedy = out.replay["action_index"][0]
    expected = tiny.reference_openvla_logits(
        weights, tokenizer, obs["rgb"][0], obs["instruction"][0], policy.action_tokenizer.to_token(greedy)
    )
    assert torch.equal(action_rows(expected).argmax(-1), greedy)


def test_openvla_statistics_unnormalize_like_openvla(tmp_path):
    tiny.write_checkpoint(tmp_path)
    policy = import_openvla(tmp_path)
    normalized = torch.tensor([[-1.0, 0.0, 1.0, 0.5]])
    q01, q99 = torch.tensor(tiny.STATS["q01"]), torch.tensor(tiny.STATS["q99"])
    expected = torch.where(
        torch.tensor(tiny.STATS["mask"]), 0.5 * (normalized + 1) * (q99 - q01 + 1e-8) + q01, normalized
    )
    torch.testing.assert_close(
        policy.normalizers["action"].unnormalize(normalized), expected, atol=1e-5, rtol=0
    )
    assert policy.cfg.vla.prompt_format == "openvla" and policy.cfg.action_dim == tiny.ACTION_DIM


def test_oft_parallel_logits_match_the_reference_forward(tmp_path):
    weights = tiny.write_checkpoint(tmp_path, oft=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_images_in_input": 2}))
    policy = import_openvla(tmp_path, decoding="oft", chunk_size=3)
    assert policy.cfg.obs_keys == ("rgb", "wrist_rgb", "state")
    proprio = json.loads((tmp_path / "dataset_statistics.json").read_text())["tiny_dataset"]["proprio"]
    weights |= {"proprio_q01": proprio["q01"], "proprio_q99": proprio["q99"]}
    obs = make_obs(2, ("rgb", "wrist_rgb"))
    with torch.no_grad():
        ours, _, _ = policy._parallel_logits(obs)
    for i in range(2):
        expected = tiny.reference_oft_logits(
            weights,
            policy.backbone.tokenizer,
            [obs["rgb"][i], obs["wrist_rgb"][i]],
            obs["instruction"][i],
            obs["state"][i],
            num_slots=3 * tiny.ACTION_DIM,
        )
        torch.testing.assert_close(ours[i], action_rows(expected), atol=1e-4, rtol=1e-4)
    out = policy.act(obs)
    torch.testing.assert_close(policy.evaluate(obs, out.replay).logprob, out.logprob, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("oft", [False, True])
def test_export_then_import_round_trip_is_exact(tmp_path, oft):
    tiny.write_checkpoint(tmp_path / "source", oft=oft)
    options = {"decoding": "oft", "chunk_size": 2} if oft else {}
    policy = import_openvla(tmp_path / "source", **options)
    export_openvla(policy, tmp_path / "exported")
    again = import_openvla(tmp_path / "exported", **options)
    ours, theirs = policy.state_dict(), again.state_dict()
    differing = [k for k in ours if not k.startswith("critic.") and not torch.equal(ours[k], theirs[k])]
    assert not differing
    # our own checkpoint format keeps the custom architecture and the Llama tokenizer
    policy.save_pretrained(tmp_path / "ours")
    loaded = load_policy(tmp_path / "ours")
    obs = make_obs(2, ("rgb", "wrist_rgb")[: 2 if oft else 1])
    out = policy.act(obs, deterministic=True)
    assert torch.equal(loaded.act(obs, deterministic=True).actions, out.actions)


def test_mismatched_keys_name_the_first_ones_and_a_cause(tmp_path):
    tiny.write_checkpoint(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 3  # the weights hold 2 layers
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"missing \['prefix_encoder.backbone.language_model.layers.2"):
        import_openvla(tmp_path)
    config["text_config"]["num_hidden_layers"] = 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"unexpected \['language_model.model.layers.1.*config.json does not"):
        import_openvla(tmp_path)


def test_wrong_action_dims_and_missing_statistics_are_refused(tmp_path):
    tiny.write_checkpoint(tmp_path)
    with pytest.raises(UserError, match="4 dims"):
        import_openvla(tmp_path, action_dim=7)
    (tmp_path / "action_head--50_checkpoint.pt").touch()
    with pytest.raises(UserError, match="continuous action head"):
        import_openvla(tmp_path)
    (tmp_path / "action_head--50_checkpoint.pt").unlink()
    (tmp_path / "dataset_statistics.json").unlink()
    with pytest.raises(UserError, match="dataset_statistics.json"):
        import_openvla(tmp_path)


def test_full_size_openvla_config_builds_on_meta():
    config = {
        "use_fused_vision_backbone": True,
        "timm_model_ids": ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"],
        "image_sizes": [224, 224],
        "timm_override_act_layers": [None, None],
        "text_config": {"model_type": "llama", "pad_token_id": 32000, "vocab_size": 32064},
        "pad_to_multiple_of": 64,
    }
    arch = architecture_from_config(config)
    assert arch.language.vocab_size == 32000 and arch.language.padded_vocab_size == 32064
    with torch.device("meta"):
        backbone = VLABackbone(arch, ("rgb",), state_dim=0)
    total = sum(p.numel() for p in backbone.parameters()) + 4096 * 32064  # + the untied LM head
    assert 7.4e9 < total < 7.7e9  # OpenVLA-7B: 7.54B
