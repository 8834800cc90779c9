"""The Policy contract for the Gaussian, flow and token-MLP families: shapes, ratio == 1, save -> load, bad
input."""

import dataclasses

import pytest
import torch
from tensordict import TensorDict

from embodrl.errors import ConfigError, UserError
from embodrl.policies.autoregressive.configuration import AutoregressiveConfig
from embodrl.policies.config import PolicyConfig
from embodrl.policies.diffusion.configuration import DiffusionConfig
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.loading import load_policy
from embodrl.policies.normalization import compute_stats
from embodrl.policies.registry import make_policy

N, C, A, S = 6, 3, 4, 5
SHAPES = {"state": (S,), "rgb": (64, 64, 3), "privileged": (7,), "task_id": ()}
VARIANTS = {
    "gaussian": dict(family="gaussian"),
    "flow-noise": dict(family="flow", flow=FlowConfig(likelihood="noise")),
    "flow-noise-sum": dict(family="flow", flow=FlowConfig(likelihood="noise", chain_reduction="sum")),
    "flow-sde": dict(family="flow", flow=FlowConfig(likelihood="sde")),
    # pi0-style action expert over the nano VLA (reads obs["instruction"] as well)
    "flow-vla-noise": dict(family="flow", flow=FlowConfig(conditioning="vla", num_steps=3)),
    "flow-vla-sde": dict(family="flow", flow=FlowConfig(conditioning="vla", likelihood="sde", num_steps=3)),
    # action tokens over 256 bins from an MLP on state (the autoregressive likelihood without the VLA)
    "token-mlp": dict(
        family="autoregressive",
        action_normalization="quantile",
        autoregressive=AutoregressiveConfig(conditioning="mlp", decoding="parallel", hidden_dims=(32, 32)),
    ),
}
LOGPROB_SHAPES = {"token": (N, C, A), "action": (N, C), "chunk": (N,)}


def make_obs(n: int = N, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    obs = TensorDict(
        {
            "state": torch.randn(n, S, generator=g) * 3 + 1,
            "rgb": torch.randint(0, 256, (n, 64, 64, 3), generator=g, dtype=torch.uint8),
            "privileged": torch.randn(n, 7, generator=g),
            "task_id": torch.randint(0, 3, (n,), generator=g),
        },
        batch_size=[n],
    )
    obs["instruction"] = ["pick up the cube", "push the cube"] * (n // 2) + ["stack"] * (n % 2)
    return obs


def build(variant: str, obs_keys=("state",), **kwargs):
    torch.manual_seed(0)
    cfg = PolicyConfig(
        chunk_size=C, action_dim=A, obs_keys=obs_keys, num_tasks=3, **VARIANTS[variant], **kwargs
    )
    policy = make_policy(cfg, SHAPES)
    policy.set_normalization(
        {
            "state": compute_stats(torch.randn(100, S) * 3 + 1),
            "action": compute_stats(torch.rand(100, A) * 0.5),
            "observation.images.rgb": {"mean": [0.0]},  # keys the policy does not use are ignored
        }
    )
    return policy


@pytest.mark.parametrize("logprob_type", ["token", "action", "chunk"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_act_shapes_and_evaluate_recomputes_identical_logprobs(variant, logprob_type):
    policy = build(variant, logprob_type=logprob_type)
    obs = make_obs()
    out = policy.act(obs)
    assert out.actions.shape == (N, C, A) and out.actions.dtype == torch.float32
    assert out.logprob.shape == LOGPROB_SHAPES[logprob_type]
    assert out.value.shape == (N,) and out.replay.batch_size == torch.Size([N])
    assert not out.logprob.requires_grad
    ev = policy.evaluate(obs, out.replay)
    ratio = (ev.logprob - out.logprob).exp()
    assert torch.equal(ratio, torch.ones_like(ratio))  # exactly 1, not approximately
    assert torch.equal(ev.value, out.value)
    # A shuffled minibatch recomputes the same values up to rounding (BLAS kernels vary with batch size).
    subset = torch.tensor([4, 0, 3])
    torch.testing.assert_close(policy.evaluate(obs[subset], out.replay[subset]).logprob, out.logprob[subset])
    assert ev.entropy.shape == (N,) and torch.isfinite(ev.entropy).all()
    ev.logprob.sum().backward()  # evaluate carries gradients to the actor
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters())


@pytest.mark.parametrize("variant", ["gaussian", "flow-noise", "flow-sde"])
def test_ratio_is_one_with_images_task_ids_and_a_privileged_critic(variant):
    policy = build(variant, obs_keys=("rgb", "state", "task_id"), value_obs_keys=("privileged",))
    obs = make_obs()
    out = policy.act(obs)
    ev = policy.evaluate(obs, out.replay)
    assert torch.equal(ev.logprob, out.logprob)
    changed = obs.clone()
    changed["privileged"] = changed["privileged"] + 1.0
    assert not torch.allclose(policy.value(changed), out.value)  # the critic reads `privileged`
    # served on a robot, which observes no privileged state: the same actions, no value (NaN)
    torch.manual_seed(3)
    expected = policy.act(obs, deterministic=True)
    torch.manual_seed(3)
    served = policy.act(obs.exclude("privileged"), deterministic=True)
    assert torch.equal(served.actions, expected.actions) and served.value.isnan().all()


@pytest.mark.parametrize("vision", ["frozen", "full"])
@pytest.mark.parametrize("variant", ["gaussian", "flow-noise", "flow-sde", "diffusion", "token-mlp"])
def test_frozen_cnn_features_are_stored_in_replay_and_evaluate_reuses_them(variant, vision):
    from embodrl.policies.finetune import prepare_finetuning
    from embodrl.policies.lora_config import LoRAConfig

    diffusion = {"family": "diffusion", "action_normalization": "quantile"}
    family = diffusion if variant == "diffusion" else VARIANTS[variant]
    torch.manual_seed(0)
    cfg = PolicyConfig(
        chunk_size=C, action_dim=A, obs_keys=("rgb", "state"), lora=LoRAConfig(vision=vision), **family
    )
    policy = prepare_finetuning(make_policy(cfg, SHAPES), cfg)
    policy.set_normalization(
        {"state": compute_stats(torch.randn(100, S)), "action": compute_stats(torch.rand(100, A))}
    )
    obs, other_images = make_obs(seed=0), make_obs(seed=1)["rgb"]
    out = policy.act(obs)
    changed = obs.clone()
    changed["rgb"] = other_images
    ev = policy.evaluate(changed, out.replay)
    if vision == "full":  # a trained CNN runs again on whatever images it is given
        assert "image_features" not in out.replay.keys() and not torch.equal(ev.logprob, out.logprob)
        return
    assert not any(p.requires_grad for p in policy.encoder.images.parameters())
    assert out.replay["image_features", "rgb"].shape == (N, cfg.image_feature_dim)
    # the stored features stand in for the CNN: other images change nothing, and the ratio is exactly 1
    assert torch.equal(ev.logprob, out.logprob)
    recomputed = policy.evaluate(obs, out.replay.exclude("image_features"))
    assert torch.equal(recomputed.logprob, ev.logprob) and torch.equal(recomputed.value, ev.value)
    ev.logprob.sum().backward()
    assert all(p.grad is None for p in policy.encoder.images.parameters())


@pytest.mark.parametrize("variant", ["gaussian", "flow-noise", "flow-sde", "flow-vla-noise"])
def test_save_then_load_gives_identical_outputs(variant, tmp_path):
    policy = build(variant, obs_keys=("state", "rgb"))
    policy.save_pretrained(tmp_path)
    tokenizer = {"tokenizer.json", "tokenizer_config.json"} if "vla" in variant else set()
    assert {p.name for p in tmp_path.iterdir()} == {
        "config.json",
        "model.safetensors",
        "normalization.safetensors",
        *tokenizer,
    }
    loaded = load_policy(tmp_path)
    assert type(loaded) is type(policy)
    obs = make_obs()
    for deterministic in (True, False):
        torch.manual_seed(1)
        expected = policy.act(obs, deterministic=deterministic)
        torch.manual_seed(1)
        got = loaded.act(obs, deterministic=deterministic)
        assert torch.equal(got.actions, expected.actions)
        assert torch.equal(got.logprob, expected.logprob)
        assert torch.equal(got.value, expected.value)


def test_loading_a_checkpoint_with_the_wrong_family_class_says_which_family_it_is(tmp_path):
    build("gaussian").save_pretrained(tmp_path)
    flow_class = type(build("flow-noise"))
    with pytest.raises(UserError, match="'gaussian' policy"):
        flow_class.from_pretrained(tmp_path)
    with pytest.raises(UserError, match="config.json is missing"):
        load_policy(tmp_path / "nowhere")


@pytest.mark.parametrize("variant", ["gaussian", "flow-noise"])
def test_deterministic_act_is_repeatable_given_the_seed_and_sampling_differs(variant):
    policy = build(variant)
    obs = make_obs()
    torch.manual_seed(3)
    a = policy.act(obs, deterministic=True).actions
    torch.manual_seed(3)
    b = policy.act(obs, deterministic=True).actions
    torch.manual_seed(3)
    c = policy.act(obs).actions
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("variant", ["gaussian", "flow-noise", "flow-sde"])
def test_sft_loss_is_a_differentiable_scalar_that_ignores_padded_steps(variant):
    policy = build(variant, obs_keys=("state", "rgb"))
    batch = make_obs()
    batch["action"] = torch.rand(N, C, A)
    is_pad = torch.zeros(N, C, dtype=torch.bool)
    is_pad[:, -1] = True
    batch["action_is_pad"] = is_pad
    torch.manual_seed(0)
    loss = policy.sft_loss(batch)
    assert loss.dim() == 0 and loss.requires_grad
    batch["action"][:, -1] = 1e3  # padded targets must not matter
    torch.manual_seed(0)
    assert torch.allclose(policy.sft_loss(batch), loss)


AUGMENTED = {
    "gaussian": VARIANTS["gaussian"],
    "flow-noise": VARIANTS["flow-noise"],
    "diffusion": {"family": "diffusion", "action_normalization": "quantile"},
    "token-mlp": VARIANTS["token-mlp"],
    "flow-vla": VARIANTS["flow-vla-noise"],
    "diffusion-vla": {
        "family": "diffusion",
        "action_normalization": "quantile",
        "diffusion": DiffusionConfig(conditioning="vla"),
    },
    "token-vla-parallel": {
        "family": "autoregressive",
        "action_normalization": "quantile",
        "autoregressive": AutoregressiveConfig(decoding="parallel"),
    },
    "token-vla-sequential": {"family": "autoregressive", "action_normalization": "quantile"},
}


@pytest.mark.parametrize("shift", [4, 0])
@pytest.mark.parametrize("variant", list(AUGMENTED))
def test_sft_loss_shifts_the_images_at_random_unless_image_shift_is_0(variant, shift, monkeypatch):
    """Random-shift augmentation is what lets a vision model trained from scratch generalize from 50 demos;
    the token MLP and the VLA heads skipped it until 2026-11-30. Acting never shifts."""
    from embodrl.policies.modules import obs_encoder
    from embodrl.policies.vla import modeling

    shifted = []
    real_shift = obs_encoder.random_shift

    def spy(images: torch.Tensor, pad: int) -> torch.Tensor:
        shifted.append((tuple(images.shape), pad))
        return real_shift(images, pad)

    monkeypatch.setattr(obs_encoder, "random_shift", spy)
    monkeypatch.setattr(modeling, "random_shift", spy)
    cfg = PolicyConfig(
        chunk_size=C, action_dim=A, obs_keys=("rgb", "state"), image_shift=shift, **AUGMENTED[variant]
    )
    policy = make_policy(cfg, SHAPES)
    policy.set_normalization(
        {"state": compute_stats(torch.randn(100, S)), "action": compute_stats(torch.rand(100, A) * 0.5)}
    )
    batch = make_obs()
    policy.act(batch)
    assert shifted == []
    batch["action"] = torch.rand(N, C, A) * 0.5
    policy.sft_loss(batch).backward()
    assert shifted == ([((N, 64, 64, 3), shift)] if shift else [])


@pytest.mark.parametrize("variant", ["gaussian", "flow-noise"])
def test_bad_inputs_raise_user_errors_that_say_what_is_wrong(variant):
    policy = build(variant)
    obs = make_obs()
    with pytest.raises(UserError, match="missing key 'state'"):
        policy.act(obs.exclude("state"))
    bad_state = obs.clone()
    bad_state["state"] = torch.randn(N, S + 2)
    with pytest.raises(UserError, match=r"obs\['state'\] has per-env shape \[7\].*built for \[5\]"):
        policy.act(bad_state)
    batch = obs.clone()
    batch["action"] = torch.rand(N, C + 1, A)
    with pytest.raises(UserError, match="chunk_size"):
        policy.sft_loss(batch)
    with pytest.raises(UserError, match="'action' entry"):
        policy.sft_loss(obs)
    with pytest.raises(UserError, match="replay lacks"):
        policy.evaluate(obs, TensorDict({}, batch_size=[N]))
    with pytest.raises(UserError, match="state.std have 2 values"):
        policy.set_normalization({"state": {"std": [1.0, 2.0]}})


def test_env_without_the_observed_key_and_out_of_range_task_ids_are_reported():
    cfg = PolicyConfig(family="flow", obs_keys=("state", "rgb"), chunk_size=C, action_dim=A)
    with pytest.raises(UserError, match=r"\['rgb'\].*does not provide"):
        make_policy(cfg, {"state": (S,)})
    policy = build("flow-noise", obs_keys=("state", "task_id"))
    obs = make_obs()
    obs["task_id"] = torch.full((N,), 3)
    with pytest.raises(UserError, match="num_tasks"):
        policy.act(obs)


@pytest.mark.parametrize("variant", list(AUGMENTED))
def test_sft_aux_keys_train_a_head_on_the_actor_features_that_acting_never_needs(variant, tmp_path):
    """policy.sft_aux_keys (pretraining on what the simulator knows): SFT also regresses the normalized
    `privileged` vector from the actor's features, through those features; acting, saving and loading
    work without it, and sft_aux_weight=0 leaves the behaviour-cloning loss alone."""
    cfg = PolicyConfig(
        chunk_size=C,
        action_dim=A,
        obs_keys=("rgb", "state"),
        sft_aux_keys=("privileged",),
        **AUGMENTED[variant],
    )
    torch.manual_seed(0)
    policy = make_policy(cfg, SHAPES)
    policy.set_normalization(
        {
            "state": compute_stats(torch.randn(100, S)),
            "privileged": compute_stats(torch.randn(100, 7)),
            "action": compute_stats(torch.rand(100, A) * 0.5),
        }
    )
    batch = make_obs()
    batch["action"] = torch.rand(N, C, A) * 0.5
    torch.manual_seed(1)
    with_aux = policy.sft_loss(batch)
    with_aux.backward()
    assert policy.aux_head[-1].weight.grad.abs().sum() > 0
    actor_grads = [p.grad for n, p in policy.named_parameters() if not n.startswith(("aux_head.", "critic."))]
    assert any(g is not None and g.abs().sum() > 0 for g in actor_grads)
    policy.cfg = dataclasses.replace(policy.cfg, sft_aux_weight=0.0)
    torch.manual_seed(1)
    without = policy.sft_loss(batch)
    assert with_aux > without  # the same draws: the difference is the auxiliary MSE
    policy.cfg = dataclasses.replace(policy.cfg, sft_aux_weight=1.0)
    with pytest.raises(UserError, match="privileged"):
        policy.sft_loss(batch.exclude("privileged"))
    policy.act(make_obs().exclude("privileged"))  # acting never reads the auxiliary targets
    policy.save_pretrained(tmp_path)
    loaded = load_policy(tmp_path)
    assert torch.equal(loaded.aux_head[-1].weight, policy.aux_head[-1].weight)


def test_sft_aux_keys_must_be_vector_observations_the_env_has():
    with pytest.raises(ConfigError, match="sft_aux_keys"):
        PolicyConfig(sft_aux_keys=("rgb",))
    cfg = PolicyConfig(family="flow", chunk_size=C, action_dim=A, sft_aux_keys=("privileged",))
    with pytest.raises(UserError, match=r"sft_aux_keys lists \['privileged'\]"):
        make_policy(cfg, {"state": (S,)})


def test_sft_aux_loss_learns_the_targets_from_the_features():
    """The head and the features it trains learn a target that the observation determines."""
    torch.manual_seed(0)
    cfg = PolicyConfig(family="flow", chunk_size=C, action_dim=A, sft_aux_keys=("privileged",))
    policy = make_policy(cfg, SHAPES)
    mix = torch.randn(S, 7)
    batch = make_obs(256)
    batch["privileged"] = torch.tanh(batch["state"] @ mix)
    batch["action"] = torch.rand(256, C, A) * 0.5
    policy.set_normalization(
        {
            "state": compute_stats(batch["state"]),
            "privileged": compute_stats(batch["privileged"]),
            "action": compute_stats(batch["action"].flatten(0, 1)),
        }
    )
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-3)

    def aux_error() -> float:
        features = policy.condition(batch)[0]
        return policy._aux_loss(batch, features).item()

    before = aux_error()
    for _ in range(150):
        loss = policy.sft_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert aux_error() < 0.3 * before


@pytest.mark.parametrize("variant", list(AUGMENTED))
def test_state_noise_perturbs_the_state_in_sft_only(variant):
    """policy.state_noise_std: the SFT loss sees a noisy proprioceptive state, acting never does."""
    cfg = PolicyConfig(chunk_size=C, action_dim=A, obs_keys=("rgb", "state"), **AUGMENTED[variant])
    torch.manual_seed(0)
    policy = make_policy(cfg, SHAPES)
    policy.set_normalization(
        {"state": compute_stats(torch.randn(100, S)), "action": compute_stats(torch.rand(100, A) * 0.5)}
    )
    batch = make_obs()
    batch["action"] = torch.rand(N, C, A) * 0.5

    def loss_and_actions(std: float) -> tuple[torch.Tensor, torch.Tensor]:
        policy.cfg = dataclasses.replace(policy.cfg, state_noise_std=std)
        for module in policy.modules():  # the encoders copy the setting when built
            if hasattr(module, "state_noise_std"):
                module.state_noise_std = std
        torch.manual_seed(1)
        loss = policy.sft_loss(batch)
        torch.manual_seed(2)
        return loss, policy.act(batch, deterministic=True).actions

    clean_loss, clean_actions = loss_and_actions(0.0)
    noisy_loss, noisy_actions = loss_and_actions(0.5)
    assert not torch.equal(noisy_loss, clean_loss)
    assert torch.equal(noisy_actions, clean_actions)
