"""`embodrl convert`: OpenVLA import/export through the dispatcher, LoRA merge, and bad requests."""

import pytest
import torch

from embodrl.convert import convert
from embodrl.errors import UserError
from embodrl.policies.loading import load_policy
from embodrl.policies.lora import LoRAConfig, apply_lora, save_lora_checkpoint
from embodrl.policies.pretrained.openvla import TIMM_VISION_TOWERS
from tests.policies.pretrained import openvla_testing as tiny
from tests.policies.vla_testing import build, make_obs


def test_openvla_import_export_import_is_exact(tmp_path, monkeypatch):
    for timm_id, tower in tiny.TOWERS.items():
        monkeypatch.setitem(TIMM_VISION_TOWERS, timm_id, tower)
    tiny.write_checkpoint(tmp_path / "openvla")
    convert("openvla-import", tmp_path / "openvla", tmp_path / "ours", chunk_size=2)
    convert("openvla-export", tmp_path / "ours", tmp_path / "back")
    convert("openvla-import", tmp_path / "back", tmp_path / "again", chunk_size=2)
    first, second = load_policy(tmp_path / "ours"), load_policy(tmp_path / "again")
    a, b = first.state_dict(), second.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a if not k.startswith("critic."))
    with pytest.raises(UserError, match="not empty"):
        convert("openvla-export", tmp_path / "ours", tmp_path / "back")
    with pytest.raises(UserError, match="unexpected keyword"):
        convert("openvla-export", tmp_path / "ours", tmp_path / "other", chunk_size=3)


def test_merge_lora_writes_a_plain_checkpoint_with_the_adapted_outputs(tmp_path):
    policy = build("autoregressive", autoregressive={"decoding": "parallel"})
    cfg = LoRAConfig(language="lora", rank=4)
    apply_lora(policy, cfg)
    for name, param in policy.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.05)
    save_lora_checkpoint(policy, cfg, tmp_path / "lora")
    convert("merge-lora", tmp_path / "lora", tmp_path / "merged")
    merged = load_policy(tmp_path / "merged")
    obs = make_obs()
    with torch.no_grad():
        torch.testing.assert_close(merged._parallel_logits(obs)[0], policy._parallel_logits(obs)[0])
    assert not any("lora_" in k for k in merged.state_dict())


def test_unknown_conversion_and_missing_source_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="merge-lora"):
        convert("onnx-export", tmp_path, tmp_path / "out")
    with pytest.raises(UserError, match="not a folder"):
        convert("openvla-import", tmp_path / "missing", tmp_path / "out")
