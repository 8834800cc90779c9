import pytest
import yaml

from embodrl.config import compose, groups, make_run_dir, presets
from embodrl.errors import ConfigError


def test_defaults_come_from_the_dataclasses():
    cfg = compose()
    assert cfg.env.suite == "tabletop-basic" and cfg.device == "cpu"


def test_experiment_presets_and_overrides_compose_in_order(tmp_path):
    cfg = compose("expert_rollout", ["env.num_envs=3"])
    assert cfg.name == "expert_rollout" and cfg.env.render_shadows  # experiment body
    assert cfg.env.num_envs == 3  # the command line wins over the experiment body
    cfg = compose(None, ["env=tabletop_lang", "env.image_size=128"])
    assert cfg.env.suite == "tabletop-lang" and cfg.env.obs_mode == "rgb" and cfg.env.image_size == 128
    exp = tmp_path / "mine.yaml"
    exp.write_text("defaults: {env: halfcheetah}\nname: cheetah\nenv: {num_envs: 2}\n")
    cfg = compose(str(exp), [])
    assert (cfg.name, cfg.env.gym_id, cfg.env.num_envs) == ("cheetah", "HalfCheetah-v5", 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.nope=1"], "unknown config key 'env.nope'; valid keys here: suite, task"),
        (["nope=1"], "unknown config key 'nope'"),
        (["env.num_envs=abc"], "env.num_envs"),
        (["env.obs_mode=depth"], "env.obs_mode='depth' is not valid; choose one of: state, rgb"),
        (["env.image_size=100"], "choose one of: 64, 128, 224"),
        (["env.num_envs=0"], "env.num_envs=0 must be > 0"),
        (["env=nope"], "is not a preset; choose one of: halfcheetah"),
        (["justaword"], "must look like key=value"),
    ],
)
def test_bad_input_gives_one_line_errors_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        compose(None, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_empty_override_is_the_empty_string():
    cfg = compose("pick_flow_noise", ["sft.dataset=", "policy.init_from="])
    assert cfg.sft.dataset == "" and cfg.policy.init_from == ""


def test_unknown_experiment_lists_choices():
    with pytest.raises(ConfigError, match="expert_rollout"):
        compose("no_such_experiment")


def test_every_shipped_preset_composes():
    for group in groups():
        for name in presets(group):
            compose(None, [f"{group}={name}"])
    for name in presets("experiment"):
        compose(name)


def test_run_dir_holds_the_resolved_config(tmp_path):
    cfg = compose(None, [f"run_root={tmp_path}", "name=x", "env.num_envs=5"])
    first, second = make_run_dir(cfg), make_run_dir(cfg)
    assert first != second and first.parent == tmp_path / "x"
    saved = yaml.safe_load((first / "config.yaml").read_text())
    assert saved["env"]["num_envs"] == 5 and saved["env"]["suite"] == "tabletop-basic"
    assert compose(str(first / "config.yaml")) == cfg  # a run's config is itself a valid experiment
