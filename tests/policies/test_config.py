"""PolicyConfig: validation, dict round trip, OmegaConf composition."""

import json

import pytest
from omegaconf import OmegaConf

from embodrl.errors import ConfigError
from embodrl.policies.autoregressive.configuration import AutoregressiveConfig
from embodrl.policies.config import FAMILIES, PolicyConfig, overridden_by_checkpoint
from embodrl.policies.diffusion.configuration import DiffusionConfig
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.lora_config import LoRAConfig


def test_dict_round_trip_through_json_restores_tuples_and_nested_configs():
    cfg = PolicyConfig(family="gaussian", obs_keys=("state", "rgb"), flow=FlowConfig(num_steps=7))
    restored = PolicyConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert restored == cfg
    assert isinstance(restored.obs_keys, tuple) and restored.flow.num_steps == 7


def test_omegaconf_overrides_reach_nested_family_config():
    schema = OmegaConf.structured(PolicyConfig)
    merged = OmegaConf.merge(schema, OmegaConf.from_dotlist(["flow.likelihood=sde", "chunk_size=8"]))
    cfg = OmegaConf.to_object(merged)
    assert cfg.flow.likelihood == "sde" and cfg.chunk_size == 8


def test_every_registered_family_is_a_valid_choice():
    for family in FAMILIES:
        assert PolicyConfig(family=family).family == family


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"family": "nope"}, "policy.family"),
        ({"logprob_type": "step"}, "policy.logprob_type"),
        ({"obs_keys": ("state", "depth")}, "obs_keys"),
        ({"obs_keys": ()}, "obs_keys is empty"),
        ({"obs_keys": ("state", "task_id")}, "num_tasks"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"action_normalization": "minmax"}, "action_normalization"),
    ],
)
def test_invalid_values_raise_config_error_naming_the_key(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PolicyConfig(**kwargs)


def test_flow_config_rejects_empty_noise_range_and_unknown_head():
    with pytest.raises(ConfigError, match="noise_std_max"):
        FlowConfig(noise_std_min=0.2, noise_std_max=0.1)
    with pytest.raises(ConfigError, match="likelihood"):
        FlowConfig(likelihood="exact")


def test_from_dict_rejects_unknown_keys():
    data = PolicyConfig().to_dict()
    data["flow"]["num_stepz"] = 3
    with pytest.raises(ConfigError, match="num_stepz"):
        PolicyConfig.from_dict(data)


def test_a_checkpoints_overridden_settings_are_its_top_level_and_own_family_fields():
    checkpoint = PolicyConfig(family="flow")
    experiment = PolicyConfig(
        family="flow",
        chunk_size=8,
        flow=FlowConfig(likelihood="sde"),
        diffusion=DiffusionConfig(ddim_eta=0.5),  # another family's: not the checkpoint's business
        lora=LoRAConfig(vision="frozen"),  # fine-tuning settings apply to a loaded checkpoint
    )
    assert overridden_by_checkpoint(experiment, checkpoint) == [
        "chunk_size=8 (checkpoint: 4)",
        "flow.likelihood=sde (checkpoint: noise)",
    ]
    assert overridden_by_checkpoint(checkpoint, checkpoint) == []
    # how rollouts sample is the run's to choose: not replaced by the checkpoint's
    tokens = PolicyConfig(family="autoregressive")
    hotter = PolicyConfig(family="autoregressive", autoregressive=AutoregressiveConfig(temperature=1.5))
    assert overridden_by_checkpoint(hotter, tokens) == []
