"""Flow-matching family configuration (torch-free; nested in PolicyConfig as `flow`)."""

from dataclasses import dataclass

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError

LIKELIHOODS = ("noise", "sde")
CHAIN_REDUCTIONS = ("mean", "sum")


@dataclass
class FlowConfig:
    """Velocity net, Euler sampler and the RL likelihood head (references/algorithms.md §C)."""

    hidden_dims: tuple[int, ...] = (256, 256, 256)  # velocity MLP on [features, x_t, time features]
    num_time_frequencies: int = 4  # sin/cos features of t: 2 * this many inputs
    num_steps: int = 4  # K Euler steps from t=1 (noise) to t=0 (action)
    likelihood: str = "noise"  # "noise": Flow-Noise (every step Gaussian); "sde": Flow-SDE (one step)
    sft_samples_per_obs: int = 1  # (noise, t) draws per observation in the SFT loss
    # Flow-Noise: a learned per-element std, tanh-bounded in [noise_std_min, noise_std_max].
    noise_std_min: float = 0.08
    noise_std_max: float = 0.16
    noise_hidden_dims: tuple[int, ...] = (128, 128)
    chain_reduction: str = "mean"  # "sum": exact chain log-density; "mean": divided by the K+1 terms
    # Flow-SDE: sigma_t = a * sqrt(t / (1 - t)); a = 0 is plain Euler.
    sde_noise_level: float = 0.5

    def __post_init__(self) -> None:
        check_positive("policy.flow.num_steps", self.num_steps)
        check_positive("policy.flow.num_time_frequencies", self.num_time_frequencies)
        check_positive("policy.flow.sft_samples_per_obs", self.sft_samples_per_obs)
        check_positive("policy.flow.noise_std_min", self.noise_std_min)
        check_positive("policy.flow.sde_noise_level", self.sde_noise_level, allow_zero=True)
        check_choice("policy.flow.likelihood", self.likelihood, LIKELIHOODS)
        check_choice("policy.flow.chain_reduction", self.chain_reduction, CHAIN_REDUCTIONS)
        if self.noise_std_max < self.noise_std_min:
            raise ConfigError(
                f"policy.flow.noise_std_max={self.noise_std_max} is below noise_std_min={self.noise_std_min}"
            )
