import pytest

from embodrl.algos import registry
from embodrl.algos.config import AlgoConfig
from embodrl.errors import ConfigError


def test_defaults_are_valid_and_pick_the_algorithms_estimator():
    ppo = AlgoConfig()
    assert ppo.estimator == "gae" and ppo.uses_critic
    grpo = AlgoConfig(name="grpo")
    assert grpo.estimator == "grpo" and not grpo.uses_critic


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("name", "td3"),
        ("advantage", "vtrace"),
        ("reward_type", "episode"),
        ("value_loss", "l1"),
        ("loss_agg", "sum"),
        ("gamma", 1.5),
        ("gae_lambda", -0.1),
        ("clip_eps_low", 1.0),
        ("clip_eps_high", -0.1),
        ("dual_clip", 1.0),
        ("value_clip", 0.0),
        ("max_grad_norm", -1.0),
        ("target_kl", 0.0),
        ("actor_lr", 0.0),
        ("critic_lr", -1e-3),
        ("num_epochs", 0),
        ("minibatch_size", 0),
        ("entropy_coef", -0.01),
        ("kl_coef", -1.0),
        ("critic_warmup_iters", -1),
        ("group_size", 1),
        ("grpo_success_range", (0.9, 0.1)),
        ("grpo_success_range", (0.1, 0.5, 0.9)),
        ("eps", 0.0),
        ("normalize_advantages", "batch"),
        ("lr_schedule", "cosine"),
        ("reward_clip", 0.0),
    ],
)
def test_bad_values_raise_config_error_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=f"algo.{key}"):
        AlgoConfig(**{key: value})


def test_grpo_cannot_use_a_critic_estimator():
    with pytest.raises(ConfigError, match="algo.advantage='gae' needs a critic"):
        AlgoConfig(name="grpo", advantage="gae")


def test_success_range_from_yaml_list_becomes_a_tuple():
    assert AlgoConfig(grpo_success_range=[0.1, 0.9]).grpo_success_range == (0.1, 0.9)


def test_registry_resolves_lazily_and_accepts_new_entries():
    assert set(registry.names("advantage")) >= {"gae", "grpo"}
    assert callable(registry.get("value_loss", "huber"))
    with pytest.raises(ConfigError, match="algo.advantage"):
        registry.get("advantage", "nope")

    def zero_estimator(rollout, last_value, cfg):
        raise NotImplementedError

    registry.register("advantage", "test-zero", zero_estimator)
    try:
        assert registry.get("advantage", "test-zero") is zero_estimator
        assert AlgoConfig(advantage="test-zero").estimator == "test-zero"
    finally:
        registry._ENTRIES["advantage"].pop("test-zero")


@pytest.mark.parametrize(
    ("value", "mode"), [(True, "rollout"), ("True", "rollout"), (False, "none"), ("false", "none")]
)
def test_advantage_normalization_reads_the_old_bool_spellings(value, mode):
    assert AlgoConfig(normalize_advantages=value).normalize_advantages == mode


def test_grouped_rollouts_share_initial_states_start_fresh_and_need_whole_groups():
    grpo, ppo = AlgoConfig(name="grpo", group_size=4), AlgoConfig(name="ppo", group_size=4)
    settings = lambda cfg: (cfg.grouped_rollouts, cfg.envs_per_initial_state, cfg.carries_episodes_over)
    assert settings(grpo) == (True, 4, False)
    assert settings(ppo) == (False, 1, True)
    grpo.check_num_envs(8)
    ppo.check_num_envs(7)
    with pytest.raises(ConfigError, match="env.num_envs=6 must be a multiple of algo.group_size=4"):
        grpo.check_num_envs(6)
