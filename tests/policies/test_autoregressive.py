"""Autoregressive (token) VLA family: bins, ratio == 1 for sequential and parallel decoding, save/load."""

import pytest
import torch
from tensordict import TensorDict

from embodrl.errors import ConfigError, UserError
from embodrl.policies.autoregressive.action_tokenizer import NUM_ACTION_TOKENS, ActionTokenizer
from embodrl.policies.autoregressive.configuration import AutoregressiveConfig
from embodrl.policies.autoregressive.modeling import entropy, processed_log_probs
from embodrl.policies.config import PolicyConfig
from embodrl.policies.finetune import prepare_finetuning
from embodrl.policies.loading import load_policy
from embodrl.policies.registry import make_policy
from tests.policies.vla_testing import INSTRUCTIONS, LOGPROB_SHAPES, A, C, N, S, build, make_obs


def test_bins_round_trip_within_half_a_bin_on_the_last_256_ids():
    tokenizer = ActionTokenizer(vocab_size=1024)
    actions = torch.cat([torch.rand(10_000) * 2 - 1, torch.tensor([-1.0, 0.0, 1.0, 1.5, -7.0])])
    index = tokenizer.to_index(actions)
    tokens = tokenizer.to_token(index)
    assert tokens.min() >= 1024 - NUM_ACTION_TOKENS and tokens.max() <= 1023
    error = (tokenizer.to_action(index) - actions.clamp(-1, 1)).abs()
    assert error.max() <= tokenizer.bin_width / 2 + 1e-6
    # OpenVLA: token = V - digitize(a); a = 1 maps to the lowest action token, a = -1 to the highest.
    assert tokens[-3].item() == 1024 - 256 and tokens[-5].item() == 1023


def test_top_k_and_temperature_processing():
    logits = torch.randn(3, 4, NUM_ACTION_TOKENS)
    log_probs = processed_log_probs(logits, torch.tensor([1.0, 0.5, 2.0]), torch.tensor([0, 5, 1]))
    finite = torch.isfinite(log_probs).sum(-1)
    assert (finite[0] == 256).all() and (finite[1] == 5).all() and (finite[2] == 1).all()
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(3, 4))
    torch.testing.assert_close(log_probs[0], torch.log_softmax(logits[0], -1))
    ent = entropy(log_probs)
    assert torch.isfinite(ent).all() and (ent[2] == 0).all() and (ent[0] > ent[1]).all()


@pytest.mark.parametrize("logprob_type", ["token", "action", "chunk"])
@pytest.mark.parametrize("decoding", ["sequential", "parallel"])
def test_evaluate_reproduces_act_logprobs(decoding, logprob_type):
    policy = build(
        "autoregressive",
        logprob_type=logprob_type,
        autoregressive={"decoding": decoding, "temperature": 1.3, "top_k": 40},
        value_obs_keys=["privileged"] if decoding == "parallel" else [],
    )
    obs = make_obs()
    out = policy.act(obs)
    assert out.actions.shape == (N, 2, 3) and out.value.shape == (N,)
    assert out.logprob.shape == LOGPROB_SHAPES[logprob_type]
    assert set(out.replay.keys()) == {"action_index", "temperature", "top_k"}
    assert (out.replay["temperature"] == 1.3).all() and (out.replay["top_k"] == 40).all()
    evaluated = policy.evaluate(obs, out.replay)
    torch.testing.assert_close(evaluated.logprob, out.logprob, atol=2e-5, rtol=1e-6)  # ratio == 1
    torch.testing.assert_close(evaluated.value, out.value, atol=1e-5, rtol=1e-5)
    assert evaluated.entropy.shape == (N,) and evaluated.logprob.requires_grad
    evaluated.logprob.sum().backward()
    assert policy.lm_head.weight.grad is not None


def test_deterministic_act_is_repeatable_and_changes_with_the_instruction():
    policy = build("autoregressive", autoregressive={"decoding": "sequential"})
    obs = make_obs()
    first, second = policy.act(obs, deterministic=True), policy.act(obs, deterministic=True)
    assert torch.equal(first.actions, second.actions)
    obs["instruction"] = ["stack the green cube"] * N
    assert not torch.equal(policy.prefix_encoder(obs).embeds, policy.prefix_encoder(make_obs()).embeds)


def test_a_run_samples_a_loaded_checkpoint_at_its_own_temperature(tmp_path):
    build("autoregressive", autoregressive={"decoding": "parallel"}).save_pretrained(tmp_path)
    run = PolicyConfig(family="autoregressive", autoregressive=AutoregressiveConfig(temperature=1.5, top_k=9))
    policy = prepare_finetuning(load_policy(tmp_path), run)
    assert policy.cfg.autoregressive.decoding == "parallel"  # the checkpoint's architecture stays
    replay = policy.act(make_obs()).replay
    assert (replay["temperature"] == 1.5).all() and (replay["top_k"] == 9).all()


@pytest.mark.parametrize("decoding", ["sequential", "parallel"])
def test_save_load_gives_identical_outputs(tmp_path, decoding):
    policy = build("autoregressive", autoregressive={"decoding": decoding})
    obs = make_obs()
    out = policy.act(obs)
    policy.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file() and (tmp_path / "model.safetensors").is_file()
    loaded = load_policy(tmp_path)
    reloaded = loaded.evaluate(obs, out.replay)
    torch.testing.assert_close(reloaded.logprob, policy.evaluate(obs, out.replay).logprob, atol=0, rtol=0)
    assert torch.equal(
        loaded.act(obs, deterministic=True).actions, policy.act(obs, deterministic=True).actions
    )


def test_a_policy_built_for_larger_images_acts_and_reloads(tmp_path):
    shapes = {"rgb": (128, 128, 3), "state": (S,)}
    cfg = PolicyConfig.from_dict(
        {
            "family": "autoregressive",
            "chunk_size": C,
            "action_dim": A,
            "obs_keys": ["rgb", "state"],
            "action_normalization": "identity",
            "vla": {"instructions": list(INSTRUCTIONS), "image_size": 128, "patch_size": 16},
        }
    )
    policy = make_policy(cfg, shapes)
    obs = make_obs().exclude("wrist_rgb", "privileged")
    with pytest.raises(UserError, match="64x64 px but this VLA preset expects 128x128"):
        policy.act(obs)
    obs["rgb"] = torch.randint(0, 256, (N, 128, 128, 3), dtype=torch.uint8)
    out = policy.act(obs)
    policy.save_pretrained(tmp_path)
    loaded = load_policy(tmp_path)
    torch.testing.assert_close(loaded.evaluate(obs, out.replay).logprob, out.logprob, atol=1e-5, rtol=1e-5)


def test_bad_replay_and_sft_batch_are_user_errors():
    policy = build("autoregressive")
    obs = make_obs()
    with pytest.raises(UserError, match="replay lacks"):
        policy.evaluate(obs, policy.act(obs).replay.exclude("top_k"))
    batch = make_obs()
    batch["action"] = torch.zeros(N, 5, 3)
    with pytest.raises(UserError, match="C=2"):
        policy.sft_loss(batch)


def test_unbounded_action_normalization_and_unsupported_keys_are_rejected():
    with pytest.raises(ConfigError, match="quantile"):
        build("autoregressive", action_normalization="mean_std")
    with pytest.raises(UserError, match="privileged"):
        build("autoregressive", obs_keys=("rgb", "privileged"))
    obs = make_obs()
    del obs["wrist_rgb"]
    with pytest.raises(UserError, match="wrist_rgb"):
        build("autoregressive").act(obs)


def test_token_mlp_needs_parallel_decoding_and_reads_no_instruction():
    with pytest.raises(ConfigError, match="decoding=parallel"):
        AutoregressiveConfig(conditioning="mlp")
    policy = build(
        "autoregressive",
        obs_keys=("state",),
        autoregressive={"conditioning": "mlp", "decoding": "parallel", "hidden_dims": (16,)},
    )
    assert policy.prefix_encoder is None and not hasattr(policy, "lm_head")
    obs = TensorDict(
        {"state": torch.randn(3, S), "task_id": torch.zeros(3, dtype=torch.long)}, batch_size=[3]
    )
    out = policy.act(obs)
    assert out.actions.shape == (3, C, A) and out.replay["action_index"].shape == (3, C * A)
    assert torch.allclose(policy.evaluate(obs, out.replay).logprob, out.logprob)


def test_label_sigma_trains_towards_a_gaussian_over_neighbouring_bins():
    mlp = {"conditioning": "mlp", "decoding": "parallel", "hidden_dims": (16,)}
    sharp = build("autoregressive", obs_keys=("state",), autoregressive=mlp)
    smooth = build("autoregressive", obs_keys=("state",), autoregressive={**mlp, "label_sigma": 2.0})
    batch = TensorDict(
        {
            "state": torch.randn(4, S),
            "task_id": torch.zeros(4, dtype=torch.long),
            "action": torch.rand(4, C, A),
        },
        batch_size=[4],
    )
    target = smooth.normalizers["action"](batch["action"])
    index = smooth.action_tokenizer.to_index(target).flatten(1)  # [4, C*A]
    logits = smooth._logits(batch, index)[0]  # the same weights in both (same seed)
    log_probs = torch.log_softmax(logits, -1)
    sharp_nll = -log_probs.gather(-1, index.unsqueeze(-1)).mean()
    distance = torch.arange(NUM_ACTION_TOKENS) - index.unsqueeze(-1)
    weights = torch.exp(-(distance**2) / (2 * 2.0**2))
    smooth_nll = -((weights / weights.sum(-1, keepdim=True)) * log_probs).sum(-1).mean()
    torch.testing.assert_close(sharp.sft_loss(batch), sharp_nll)
    torch.testing.assert_close(smooth.sft_loss(batch), smooth_nll)
    with pytest.raises(ConfigError, match="label_sigma"):
        AutoregressiveConfig(label_sigma=-1.0)
