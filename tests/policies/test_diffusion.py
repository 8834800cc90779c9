"""Diffusion family (DPPO likelihood): schedule vs diffusers, ratio == 1, floors, clamps, save/load."""

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from embodrl.errors import ConfigError, UserError
from embodrl.policies.diffusion.configuration import DiffusionConfig
from embodrl.policies.diffusion.dppo import DenoisingMDP
from embodrl.policies.finetune import prepare_finetuning
from embodrl.policies.loading import load_policy
from tests.policies.vla_testing import LOGPROB_SHAPES, N, build, make_obs

DDIM = {"scheduler": "ddim", "num_train_timesteps": 100, "num_inference_steps": 5, "ft_denoising_steps": 3}


def test_ddpm_step_matches_diffusers():
    cfg = DiffusionConfig(num_train_timesteps=20, num_inference_steps=20)
    mdp = DenoisingMDP(cfg)
    reference = DDPMScheduler(num_train_timesteps=20, beta_schedule="squaredcos_cap_v2", clip_sample=True)
    reference.set_timesteps(20)
    x, eps = torch.randn(4, 2, 3), torch.randn(4, 2, 3)
    for i, t in enumerate(reference.timesteps):
        sample = reference.step(eps, t, x, generator=torch.Generator().manual_seed(0)).prev_sample
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(0)) if t > 0 else 0.0
        step = torch.full((4,), i)
        torch.testing.assert_close(
            mdp.step_mean(x, eps, step) + mdp.std[i] * noise, sample, atol=1e-5, rtol=1e-5
        )


def test_ddim_step_matches_diffusers_with_eta():
    mdp = DenoisingMDP(DiffusionConfig(**DDIM, ddim_eta=0.0))
    reference = DDIMScheduler(
        num_train_timesteps=100, beta_schedule="squaredcos_cap_v2", clip_sample=True, set_alpha_to_one=True
    )
    reference.set_timesteps(5)
    x, eps = torch.randn(4, 2, 3), torch.randn(4, 2, 3)
    for i, t in enumerate(reference.timesteps):
        expected = reference.step(eps, t, x, eta=0.0, use_clipped_model_output=True).prev_sample  # as DPPO
        torch.testing.assert_close(mdp.step_mean(x, eps, torch.full((4,), i)), expected, atol=1e-5, rtol=1e-5)
    assert (DenoisingMDP(DiffusionConfig(**DDIM, ddim_eta=1.0)).std[:-1] > 0).all()


@pytest.mark.parametrize("logprob_type", ["token", "action", "chunk"])
@pytest.mark.parametrize("variant", ["ddpm-mlp", "ddim-mlp", "ddpm-vla", "ddim-vla"])
def test_evaluate_reproduces_act_logprobs(variant, logprob_type):
    scheduler, conditioning = variant.split("-")
    diffusion = {"conditioning": conditioning, **(DDIM if scheduler == "ddim" else {"ft_denoising_steps": 4})}
    obs_keys = ("state",) if conditioning == "mlp" else ("rgb", "wrist_rgb", "state")
    policy = build("diffusion", obs_keys=obs_keys, logprob_type=logprob_type, diffusion=diffusion)
    obs = make_obs()
    out = policy.act(obs)
    k_prime = diffusion["ft_denoising_steps"]
    assert out.actions.shape == (N, 2, 3) and out.replay["chain"].shape == (N, k_prime + 1, 2, 3)
    assert out.logprob.shape == LOGPROB_SHAPES[logprob_type] and out.value.shape == (N,)
    evaluated = policy.evaluate(obs, out.replay)
    torch.testing.assert_close(evaluated.logprob, out.logprob, atol=1e-6, rtol=1e-6)  # ratio == 1
    assert evaluated.entropy.shape == (N,) and evaluated.logprob.requires_grad


def test_logprob_floor_and_clamp():
    policy = build(
        "diffusion", obs_keys=("state",), diffusion={"min_logprob_std": 0.1, "ft_denoising_steps": 5}
    )
    obs = make_obs()
    out = policy.act(obs)
    token = policy.mdp.chain_logprob(policy._eps_model(policy.features(obs)), out.replay["chain"])[0]
    assert (token >= -5.0).all() and (token <= 2.0).all()
    # With a std floor of 0.1, no per-element density exceeds that of N(0, 0.1^2) at its mean.
    assert token.max() <= torch.distributions.Normal(0.0, 0.1).log_prob(torch.tensor(0.0)) + 1e-5
    far = out.replay.clone()
    far["chain"][:, -1] += 100.0  # a wildly improbable last step is clamped, not -inf
    clamped = policy.evaluate(obs, far).logprob
    assert torch.isfinite(clamped).all()


def test_sampling_floor_makes_ddim_eta0_stochastic_and_deterministic_act_uses_means():
    policy = build("diffusion", obs_keys=("state",), diffusion={**DDIM, "ddim_eta": 0.0})
    obs = make_obs()

    def act(seed: int, deterministic: bool):
        torch.manual_seed(seed)  # the initial noise x_T is drawn in both modes
        return policy.act(obs, deterministic=deterministic).actions

    assert torch.equal(act(3, True), act(3, True))
    assert not torch.equal(act(3, False), act(3, True))  # eta = 0, but the 0.1 sampling floor adds noise


@pytest.mark.parametrize("conditioning", ["mlp", "vla"])
def test_save_load_gives_identical_outputs(tmp_path, conditioning):
    obs_keys = ("state",) if conditioning == "mlp" else ("rgb", "state")
    policy = build("diffusion", obs_keys=obs_keys, diffusion={"conditioning": conditioning})
    obs = make_obs()
    out = policy.act(obs)
    policy.save_pretrained(tmp_path)
    assert (tmp_path / "tokenizer.json").is_file() == (conditioning == "vla")
    loaded = load_policy(tmp_path)
    torch.testing.assert_close(loaded.evaluate(obs, out.replay).logprob, out.logprob, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(loaded.value(obs), policy.value(obs), atol=0, rtol=0)


def test_bad_config_and_replay_are_errors():
    with pytest.raises(ConfigError, match="ft_denoising_steps"):
        DiffusionConfig(num_inference_steps=5, ft_denoising_steps=6)
    with pytest.raises(ConfigError, match="scheduler"):
        DiffusionConfig(scheduler="euler")
    policy = build("diffusion", obs_keys=("state",))
    with pytest.raises(UserError, match="replay lacks"):
        policy.evaluate(make_obs(), policy.act(make_obs()).replay.exclude("chain"))


@pytest.mark.parametrize("readout", ["pool", "attention"])
def test_a_frozen_vla_prefix_is_cached_for_the_update_and_gives_the_same_logprobs(readout):
    # the state token's projection belongs to the frozen language group: a prefix reading it is cached too
    vla = {"obs_keys": ("rgb", "state"), "diffusion": {"conditioning": "vla", "prefix_readout": readout}}
    policy = build("diffusion", **vla, train_expert_only=True, cache_frozen_prefix=True)
    prepare_finetuning(policy, policy.cfg)
    obs = make_obs()
    out = policy.act(obs)
    assert out.replay["prefix_hidden"].shape[::2] == (N, policy.prefix_encoder.hidden_size)
    cached = policy.evaluate(obs, out.replay)
    recomputed = policy.evaluate(obs, out.replay.exclude("prefix_hidden", "prefix_mask"))
    torch.testing.assert_close(cached.logprob, recomputed.logprob)
    cached.logprob.sum().backward()  # the denoiser (and an attention readout) train from the cache alone
    trained_parts = [policy.denoiser] + ([policy.readout] if readout == "attention" else [])
    for part in trained_parts:
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in part.parameters())
    trained = build("diffusion", **vla, cache_frozen_prefix=True)
    assert "prefix_hidden" not in trained.act(obs).replay.keys()  # a prefix that trains runs again


def test_the_attention_readout_tells_apart_prefixes_that_pool_alike():
    # the first two positions swapped: the mean and the last position agree, only where things are differs
    from embodrl.policies.vla.readout import PrefixReadout

    torch.manual_seed(0)
    hidden = torch.randn(1, 5, 8)
    swapped = hidden[:, [1, 0, 2, 3, 4]]
    mask = torch.ones(1, 5, dtype=torch.bool)
    pool_readout, attention = PrefixReadout("pool", 8), PrefixReadout("attention", 8, 2, 2, max_positions=16)
    torch.testing.assert_close(pool_readout(hidden, mask), pool_readout(swapped, mask))
    assert attention(hidden, mask).shape == (1, attention.out_dim) == (1, 2 * 8 + 2 * 8)
    assert not torch.allclose(attention(hidden, mask), attention(swapped, mask))
    # a padded position is never read: its content does not matter
    masked = mask.clone()
    masked[0, 4] = False
    changed = hidden.clone()
    changed[0, 4] = 100.0
    torch.testing.assert_close(attention(hidden, masked)[:, 16:], attention(changed, masked)[:, 16:])


def test_sft_draws_several_noises_per_frame_from_one_prefix_pass_and_ignores_padded_steps():
    vla = {"obs_keys": ("rgb",), "diffusion": {"conditioning": "vla", "sft_samples_per_obs": 4}}
    policy = build("diffusion", **vla)
    passes = []
    policy.prefix_encoder.register_forward_hook(lambda *_: passes.append(1))
    batch = make_obs()
    c, a = policy.chunk_shape
    batch["action"] = torch.rand(N, c, a) * 2 - 1
    batch["action_is_pad"] = torch.zeros(N, c, dtype=torch.bool)
    batch["action_is_pad"][:, -1] = True
    torch.manual_seed(0)
    loss = policy.sft_loss(batch)
    assert len(passes) == 1 and loss.dim() == 0 and loss.requires_grad
    batch["action"][:, -1] = 0.9  # padded targets must not matter
    torch.manual_seed(0)
    torch.testing.assert_close(policy.sft_loss(batch), loss)
    # four draws per frame: the loss of one seed is the mean of four single-draw losses' worth of terms
    single = build("diffusion", obs_keys=("rgb",), diffusion={"conditioning": "vla"})
    single.load_state_dict(policy.state_dict())
    losses = []
    for seed in range(8):
        torch.manual_seed(seed)
        losses.append((policy.sft_loss(batch).item(), single.sft_loss(batch).item()))
    spread = torch.tensor(losses).std(0)
    assert spread[0] < spread[1]  # averaging over more draws steadies the loss
