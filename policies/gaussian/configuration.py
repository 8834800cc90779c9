"""Gaussian actor-critic configuration (torch-free; nested in PolicyConfig as `gaussian`)."""

from dataclasses import dataclass

from embodrl.choices import check_choice, check_positive

ACTIVATIONS = ("elu", "relu", "silu", "tanh", "gelu")
# pytorch: nn.Linear's default; orthogonal: CleanRL's PPO init (gain sqrt(2) on hidden layers, 0.01 on
# the actor's output, 1 on the value output, zero biases)
INITS = ("pytorch", "orthogonal")


@dataclass
class GaussianConfig:
    """Diagonal Gaussian over normalized actions with a state-independent std (RSL-RL's actor)."""

    hidden_dims: tuple[int, ...] = (256, 256, 256)  # actor MLP on the encoded observation
    activation: str = "elu"
    init_std: float = 1.0  # initial std in normalized action units; learned as a free log-std
    init: str = "pytorch"  # INITS: how the actor and critic MLPs' weights start

    def __post_init__(self) -> None:
        check_choice("policy.gaussian.activation", self.activation, ACTIVATIONS)
        check_positive("policy.gaussian.init_std", self.init_std)
        check_choice("policy.gaussian.init", self.init, INITS)
