"""Flow-matching family configuration (torch-free; nested in PolicyConfig as `flow`)."""

from dataclasses import dataclass

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError

LIKELIHOODS = ("noise", "sde")
CHAIN_REDUCTIONS = ("mean", "sum")
CONDITIONINGS = ("mlp", "vla")
VLA_VARIANTS = ("pi0", "pi05")


@dataclass
class FlowConfig:
    """Velocity net, Euler sampler and the RL likelihood head (Flow-Noise / Flow-SDE of pi_RL, Chen et al.
    2025; see docs/algorithms.md)."""

    # "mlp": a velocity MLP on ObsEncoder features; "vla": pi0's action expert, a Gemma-style transformer
    # whose layers attend to the cached keys/values of the VLA prefix (policy.vla picks the backbone).
    conditioning: str = "mlp"
    # vla only. "pi0": state token + action/time MLP in the expert; "pi05": time through adaRMS norms,
    # the state as discretized tokens in the prompt.
    vla_variant: str = "pi0"
    action_horizon: int = 0  # vla: chunk length H the expert denoises (pi0: 50); 0 = policy.chunk_size
    max_action_dim: int = 0  # vla: actions zero-padded to this width (pi0: 32); 0 = policy.action_dim
    max_state_dim: int = 0  # vla: state zero-padded to this width (pi0: 32); 0 = the env's state size
    # vla prompts. openpi strips the instruction and turns underscores and newlines into spaces; LeRobot's
    # pi0 processor reads it as given (pi05 cleans in both).
    clean_instruction: bool = True
    # pi05: the normalized state is zero-padded to this width before it is discretized into the prompt
    # (LeRobot pads to its max_state_dim, 32); 0 = the state as it is (openpi).
    prompt_state_dim: int = 0
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
        check_choice("policy.flow.conditioning", self.conditioning, CONDITIONINGS)
        check_choice("policy.flow.vla_variant", self.vla_variant, VLA_VARIANTS)
        for key in ("action_horizon", "max_action_dim", "max_state_dim", "prompt_state_dim"):
            check_positive(f"policy.flow.{key}", getattr(self, key), allow_zero=True)
        if self.noise_std_max < self.noise_std_min:
            raise ConfigError(
                f"policy.flow.noise_std_max={self.noise_std_max} is below noise_std_min={self.noise_std_min}"
            )
