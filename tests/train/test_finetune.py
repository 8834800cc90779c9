"""Fine-tuning an imported VLA: SFT with LoRA and one PPO iteration with a frozen VLM on the embedded suite,
LoRA checkpoints that reload, resume and merge exactly, gradient checkpointing and bf16 PPO updates."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tensordict import TensorDict

from embodrl.config import compose, make_run_dir
from embodrl.convert import convert
from embodrl.errors import ConfigError, UserError
from embodrl.policies.checkpoint import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from embodrl.policies.finetune import enable_gradient_checkpointing, prepare_finetuning
from embodrl.policies.loading import load_policy
from embodrl.policies.lora import group_of
from embodrl.policies.pretrained.pi0 import import_pi0
from embodrl.sims.registry import make_env
from embodrl.train.checkpointing import LAST
from embodrl.train.collect import CollectConfig, collect_demos
from embodrl.train.logger import read_metrics
from embodrl.train.rl_runner import OnPolicyRunner
from embodrl.train.sft_runner import SFTRunner
from tests.pendulum import pendulum
from tests.policies.pretrained.pi0_testing import V_WIDTH, VISION, write_checkpoint
from tests.policies.vla_testing import build, make_obs

LANG = [
    "env=tabletop_lang",
    "env.task=reach",
    "env.num_envs=2",
    "env.max_episode_steps=16",
    "train.tensorboard=false",
]
SFT = ["sft.steps=3", "sft.batch_size=8", "sft.warmup_steps=1", "sft.eval_every=0", "sft.eval_episodes=2"]
LORA = ["policy.lora.vision=frozen", "policy.lora.language=lora", "policy.lora.rank=4"]
PPO_ONE = [
    "train.iterations=1",
    "train.eval_every=0",
    "train.eval_episodes=2",
    "algo.critic_warmup_iters=0",
    "algo.target_kl=null",
    "algo.num_epochs=1",
    "algo.minibatch_size=8",
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("finetune")


@pytest.fixture(scope="module")
def pi0_checkpoint(workdir):
    """openpi's tiny pi0 reshaped for the language suite (64 px camera, its state/action sizes), imported."""
    env_cfg = compose(None, LANG).env
    with make_env(env_cfg) as env:
        state_dim, action_dim = env.observation_spec["state"].shape[-1], env.action_spec.dim
    src = workdir / "pi0_openpi"
    write_checkpoint(src, "pi0", "openpi")
    weights = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    weights[VISION + "embeddings.position_embedding.weight"] = torch.randn(64, V_WIDTH, generator=g) * 0.2
    save_file(weights, str(src / "model.safetensors"))
    stats = {
        key: {"mean": [0.0] * dim, "std": [1.0] * dim, "q01": [-1.0] * dim, "q99": [1.0] * dim}
        for key, dim in (("state", state_dim), ("actions", action_dim))
    }
    (src / "assets" / "libero" / "norm_stats.json").write_text(json.dumps({"norm_stats": stats}))
    out = workdir / "pi0"
    import_pi0(src, out, fmt="openpi", obs_keys=("rgb", "state"), chunk_size=4, num_steps=2)
    return out


@pytest.fixture(scope="module")
def demos(workdir):
    out = workdir / "demos"
    collect_demos(compose(None, LANG).env, out, CollectConfig(episodes_per_task=2), progress=False)
    return out


@pytest.fixture(scope="module")
def lora_sft(workdir, pi0_checkpoint, demos):
    """An SFT run with LoRA on the language model, frozen vision and a fully trained action expert."""
    overrides = [*LANG, *SFT, *LORA, f"policy.init_from={pi0_checkpoint}", f"sft.dataset={demos}"]
    cfg = compose(None, [*overrides, f"run_root={workdir / 'runs'}"])
    runner = SFTRunner(cfg, make_run_dir(cfg))
    runner.learn()
    return runner


def _replay_logprob(policy, obs: TensorDict, replay: TensorDict) -> torch.Tensor:
    with torch.no_grad():
        return policy.evaluate(obs, replay).logprob


def test_lora_sft_trains_only_adapters_and_head_and_its_checkpoint_reloads(lora_sft, pi0_checkpoint, workdir):
    policy = lora_sft.policy
    base = load_policy(pi0_checkpoint).state_dict()
    changed = {  # peft starts lora_B at zero (and lora_A random): a trained adapter has lora_B != 0
        name
        for name, value in policy.state_dict().items()
        if (".lora_B." in name and value.any())
        or (".lora_" not in name and not torch.equal(value, base[name.replace(".base_layer.", ".")]))
    }
    assert any(".lora_B." in name for name in changed)
    assert any(name.startswith("action_expert.") for name in changed)
    assert all(".lora_" in name or group_of(name) == "action_head" for name in changed), changed

    directory = lora_sft.run_dir / LAST / "policy"
    assert (directory / ADAPTER_CONFIG_FILE).is_file() and (directory / ADAPTER_WEIGHTS_FILE).is_file()
    with make_env(lora_sft.cfg.env) as env:
        obs = env.reset(seed=3)
    torch.manual_seed(0)
    replay = policy.act(obs).replay
    expected = _replay_logprob(policy, obs, replay)
    merged = load_policy(directory)  # what eval, serve and policy.init_from get
    assert not any(".lora_" in name for name in merged.state_dict())
    torch.testing.assert_close(_replay_logprob(merged, obs, replay), expected, atol=1e-5, rtol=1e-5)
    convert("merge-lora", directory, workdir / "merged")
    torch.testing.assert_close(
        _replay_logprob(load_policy(workdir / "merged"), obs, replay), expected, atol=1e-5, rtol=1e-5
    )
    adapted = load_policy(directory, merge_adapters=False)  # what --resume gets: exactly the trained weights
    saved = adapted.state_dict()
    assert all(torch.equal(saved[name], value) for name, value in policy.state_dict().items())
    resumed = SFTRunner(lora_sft.cfg, lora_sft.run_dir, resume=True)
    assert resumed.step == lora_sft.step == 3
    trainable = sum(p.requires_grad for p in policy.parameters())
    assert len(resumed.optimizer.param_groups[0]["params"]) == trainable


def test_ppo_iteration_from_the_lora_sft_checkpoint_with_a_frozen_vlm(lora_sft, workdir):
    init = lora_sft.run_dir / LAST / "policy"
    overrides = [*LANG, *PPO_ONE, "policy.train_expert_only=true", f"policy.init_from={init}"]
    cfg = compose(None, [*overrides, f"run_root={workdir / 'runs'}"])
    runner = OnPolicyRunner(cfg, make_run_dir(cfg))
    trainable = {name for name, p in runner.policy.named_parameters() if p.requires_grad}
    assert trainable and not any(name.startswith("prefix_encoder.") for name in trainable)
    optimized = sum(len(group["params"]) for group in runner.algo.optimizer.param_groups)
    assert optimized == len(trainable)
    before = {name: value.clone() for name, value in runner.policy.state_dict().items()}
    runner.learn()
    row = read_metrics(runner.run_dir)[-1]
    assert row["train/critic_only"] == 0.0 and row["train/minibatches"] > 0
    assert row["train/ratio0_maxdev"] < 1e-4
    after = runner.policy.state_dict()
    assert all(torch.equal(after[n], v) for n, v in before.items() if n.startswith("prefix_encoder."))
    assert any(not torch.equal(after[n], v) for n, v in before.items() if n.startswith("action_expert."))
    reloaded = load_policy(runner.run_dir / LAST / "policy")  # a plain checkpoint: no adapters left
    assert reloaded.cfg.train_expert_only and not reloaded.cfg.lora.uses_lora


def test_gradient_checkpointing_gives_the_same_gradients():
    def grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        policy = build("autoregressive", autoregressive={"decoding": "parallel"})
        if checkpointing:
            assert enable_gradient_checkpointing(policy) == [
                "prefix_encoder.backbone.vision_towers.0",
                "prefix_encoder.backbone.language_model",
            ]
        policy.train()
        batch = make_obs()
        batch["action"] = torch.randn(batch.batch_size[0], policy.cfg.chunk_size, policy.cfg.action_dim) * 0.3
        torch.manual_seed(0)
        policy.sft_loss(batch).backward()
        return {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}

    plain, checkpointed = grads(False), grads(True)
    assert plain.keys() == checkpointed.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_flow_vla_checkpoints_its_towers_but_keeps_the_prefix_cache():
    policy = build("flow", flow={"conditioning": "vla", "num_steps": 2})
    # the expert reads the language model's key/value cache with gradients: that model is not checkpointed
    assert enable_gradient_checkpointing(policy) == ["prefix_encoder.backbone.vision_towers.0"]
    policy.train()
    obs = make_obs()
    out = policy.evaluate(obs, policy.act(obs).replay)
    out.logprob.sum().backward()
    assert policy.action_expert.action_out_proj.weight.grad is not None


def test_bf16_autocasts_the_ppo_update(tmp_path):
    cfg = pendulum("env.num_envs=2", "train.precision=bf16", f"run_root={tmp_path}", *PPO_ONE)
    runner = OnPolicyRunner(cfg, make_run_dir(cfg))
    dtypes = []
    hook = runner.policy.critic.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    runner.learn()
    hook.remove()
    assert torch.bfloat16 in dtypes  # the update's forward passes (rollout and eval run in fp32)
    row = read_metrics(runner.run_dir)[-1]
    assert all(torch.isfinite(torch.tensor(row[k])) for k in ("train/loss", "train/policy_loss"))
    assert all(p.dtype == torch.float32 for p in runner.policy.parameters())


def test_bad_finetuning_settings_are_refused():
    with pytest.raises(ConfigError, match="train_expert_only"):
        compose(None, ["policy.train_expert_only=true", "policy.lora.language=lora"])
    with pytest.raises(ConfigError, match="policy.lora.vision"):
        compose(None, ["policy.lora.vision=adapter"])
    gaussian = compose(None, ["policy.family=gaussian", "policy.train_expert_only=true"]).policy
    with pytest.raises(UserError, match="train_expert_only=false"):
        prepare_finetuning(build("gaussian", obs_keys=("state",)), gaussian)
    with pytest.raises(UserError, match="gradient_checkpointing=false"):
        enable_gradient_checkpointing(build("gaussian", obs_keys=("state",)))


def test_a_prefix_cache_asked_for_a_prefix_that_trains_is_named_in_a_warning(caplog):
    for expert_only in (False, True):
        cfg = compose(None, ["policy.cache_frozen_prefix=true", f"policy.train_expert_only={expert_only}"])
        caplog.clear()
        prepare_finetuning(build("diffusion", diffusion={"conditioning": "vla"}), cfg.policy)
        warnings = [r.getMessage() for r in caplog.records if "cache_frozen_prefix" in r.getMessage()]
        if expert_only:
            assert warnings == []
        else:
            assert len(warnings) == 1 and "language_model" in warnings[0]


def test_the_instruction_film_is_part_of_the_vision_group_and_freezes_with_the_vlm():
    policy = build("diffusion", diffusion={"conditioning": "vla"}, vla={"instruction_film": True})
    assert group_of("prefix_encoder.backbone.film.linear.weight") == "vision"
    cfg = compose(None, ["policy.cache_frozen_prefix=true", "policy.train_expert_only=true"])
    prepare_finetuning(policy, cfg.policy)
    film = policy.prefix_encoder.backbone.film
    assert policy.prefix_encoder.frozen and not film.linear.weight.requires_grad


@pytest.mark.parametrize("experiment", [f"pi0_flow_noise_{x}" for x in ("libero", "maniskill", "nano")])
def test_flow_noise_recipes_compose(experiment):
    cfg = compose(experiment)
    assert cfg.policy.family == "flow" and cfg.policy.flow.likelihood == "noise"
    assert cfg.policy.flow.num_steps == 4 and cfg.policy.chunk_size == 5
    assert cfg.policy.trained_groups.language == cfg.policy.trained_groups.vision == "frozen"
    assert (cfg.algo.entropy_coef, cfg.algo.clip_eps_low, cfg.algo.clip_eps_high) == (0.005, 0.2, 0.2)
