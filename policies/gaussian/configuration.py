"""Gaussian actor-critic configuration (torch-free; nested in PolicyConfig as `gaussian`)."""

from dataclasses import dataclass

from embodrl.choices import check_choice, check_positive

ACTIVATIONS = ("elu", "relu", "silu", "tanh", "gelu")
# pytorch: nn.Linear's default; orthogonal: CleanRL's PPO init (gain sqrt(2) on hidden layers, 0.01 on
# the actor's output, 1 on the value output, zero biases)
INITS = ("pytorch", "orthogonal")
# none: an unbounded Gaussian with a free log-std (PPO; the env clips); tanh: a tanh-squashed Gaussian
# with a state-dependent std (SAC's actor), its actions inside [-1, 1] in normalized units
SQUASHES = ("none", "tanh")


@dataclass
class GaussianConfig:
    """Diagonal Gaussian over normalized actions: RSL-RL's actor (state-independent std), or with
    squash=tanh SAC's (tanh-squashed, state-dependent std)."""

    hidden_dims: tuple[int, ...] = (256, 256, 256)  # actor MLP on the encoded observation
    activation: str = "elu"
    init_std: float = 1.0  # initial std in normalized action units; learned as a free log-std
    init: str = "pytorch"  # INITS: how the actor and critic MLPs' weights start
    squash: str = "none"  # SQUASHES; off-policy algorithms (algo=sac) need tanh

    def __post_init__(self) -> None:
        check_choice("policy.gaussian.activation", self.activation, ACTIVATIONS)
        check_positive("policy.gaussian.init_std", self.init_std)
        check_choice("policy.gaussian.init", self.init, INITS)
        check_choice("policy.gaussian.squash", self.squash, SQUASHES)
