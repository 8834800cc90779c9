"""Diffusion family configuration (torch-free; nested in PolicyConfig as `diffusion`)."""

from dataclasses import dataclass

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError

CONDITIONINGS = ("mlp", "vla")
PREFIX_READOUTS = ("pool", "attention")
SCHEDULERS = ("ddpm", "ddim")
BETA_SCHEDULES = ("squaredcos_cap_v2", "linear", "scaled_linear")
CHAIN_REDUCTIONS = ("mean", "sum")


@dataclass
class DiffusionConfig:
    """Epsilon-prediction head, diffusers scheduler and DPPO likelihood (Ren et al. 2024; see
    docs/algorithms.md)."""

    # "mlp": observation features from the shared ObsEncoder (state MLP / CNN); "vla": the pooled prefix
    # of the VLA backbone (images + instruction + state; policy.vla picks the preset).
    conditioning: str = "mlp"
    # How the denoiser reads the VLA prefix (conditioning=vla): "pool" its mean and last position; "attention"
    # adds `readout_queries` learned queries attending over every prefix token, so image cells stay apart.
    prefix_readout: str = "pool"
    readout_queries: int = 4
    readout_heads: int = 4
    hidden_dims: tuple[int, ...] = (256, 256, 256)  # epsilon MLP on [features, x_t, time features]
    num_time_frequencies: int = 6
    # (noise, timestep) draws per observation in the SFT loss: the features (a VLA prefix pass) are computed
    # once and the denoiser MLP, cheap beside them, sees R draws (one per frame starves it at small batches)
    sft_samples_per_obs: int = 1
    scheduler: str = "ddpm"
    beta_schedule: str = "squaredcos_cap_v2"  # DPPO's cosine schedule
    num_train_timesteps: int = 20  # DPPO's K for DDPM; DDIM configs train on more (e.g. 100)
    num_inference_steps: int = 20  # denoising steps when acting (DDIM: e.g. 5)
    ft_denoising_steps: int = 10  # K': the last K' steps form the Gaussian MDP whose chain is replayed
    ddim_eta: float = 1.0  # DDIM stochasticity (DPPO fine-tunes with eta=1)
    min_sampling_std: float = 0.1  # std floor when sampling a fine-tuned step (exploration)
    min_logprob_std: float = 0.1  # std floor inside log-probs (keeps ratios finite)
    noise_clip: float = 3.0  # sampling noise clipped to +-3 std
    logprob_min: float = -5.0  # per-element log-prob clamp (DPPO)
    logprob_max: float = 2.0
    chain_reduction: str = "mean"  # "sum": exact log-density of the K' steps; "mean": divided by K'

    def __post_init__(self) -> None:
        check_choice("policy.diffusion.conditioning", self.conditioning, CONDITIONINGS)
        check_choice("policy.diffusion.prefix_readout", self.prefix_readout, PREFIX_READOUTS)
        check_choice("policy.diffusion.scheduler", self.scheduler, SCHEDULERS)
        check_choice("policy.diffusion.beta_schedule", self.beta_schedule, BETA_SCHEDULES)
        check_choice("policy.diffusion.chain_reduction", self.chain_reduction, CHAIN_REDUCTIONS)
        for key in (
            "num_train_timesteps",
            "num_inference_steps",
            "ft_denoising_steps",
            "num_time_frequencies",
            "sft_samples_per_obs",
            "readout_queries",
            "readout_heads",
        ):
            check_positive(f"policy.diffusion.{key}", getattr(self, key))
        for key in ("ddim_eta", "min_sampling_std", "min_logprob_std", "noise_clip"):
            check_positive(f"policy.diffusion.{key}", getattr(self, key), allow_zero=True)
        if self.num_inference_steps > self.num_train_timesteps:
            raise ConfigError(
                f"policy.diffusion.num_inference_steps={self.num_inference_steps} exceeds "
                f"num_train_timesteps={self.num_train_timesteps}"
            )
        if self.ft_denoising_steps > self.num_inference_steps:
            raise ConfigError(
                f"policy.diffusion.ft_denoising_steps={self.ft_denoising_steps} exceeds "
                f"num_inference_steps={self.num_inference_steps}"
            )
        if self.logprob_min >= self.logprob_max:
            raise ConfigError("policy.diffusion.logprob_min must be below logprob_max")
