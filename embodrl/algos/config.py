"""Algorithm configuration (torch-free; composed into the experiment config as `algo`).

Defaults follow what worked in the calibration prototype (references/prototype-calibration.md §4):
GAE gamma 0.99 / lambda 0.95 per decision, clip 0.2, lr 1e-4, 4 epochs of minibatch 256, approx-KL
early stop at 0.05, grad-norm 1, 5 critic-only warm-up iterations. The off-policy block (SAC with RLPD's
recipe) follows RLPD (Ball et al. 2023): 10 LayerNorm critics, a random pair for the target's minimum,
tau 0.005, initial temperature 1, target entropy -|A|; configs/algo/sac.yaml sets its learning rates.
"""

from dataclasses import dataclass

from embodrl.algos import registry
from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError

# off-policy ones also have a registry entry of kind "off_policy"
ALGORITHMS = ("ppo", "grpo", "sac", "dsrl_na")
# The estimator each algorithm uses unless `advantage` names another one.
DEFAULT_ADVANTAGE = {"ppo": "gae", "grpo": "grpo"}
REWARD_TYPES = ("action", "chunk")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean")
# rollout: over all valid samples of the rollout; minibatch: within each minibatch (CleanRL, SB3); none
ADVANTAGE_NORMALIZATIONS = ("rollout", "minibatch", "none")
# YAML written before the choice existed held a bool (OmegaConf hands it over as "True"/"False")
_LEGACY_ADVANTAGE_NORMALIZATION = {"true": "rollout", "false": "none"}
LR_SCHEDULES = ("constant", "linear")  # linear: from the set rates down to 0 at train.iterations


@dataclass
class AlgoConfig:
    """PPO or GRPO: advantage estimation, the clipped loss and the update schedule; SAC (off-policy): the
    replay buffers, the critic ensemble and the temperature."""

    name: str = "ppo"  # ppo: actor-critic; grpo: critic-free, group-normalized returns; sac: off-policy
    advantage: str | None = None  # estimator by registry name; None: the algorithm's own (ppo: gae)
    gamma: float = 0.99
    gae_lambda: float = 0.95  # applied once per decision (one chunk)
    # chunk: gamma once per decision; action: gamma per executed env step inside the chunk
    reward_type: str = "chunk"
    clip_eps_low: float = 0.2  # ratio clipped to [1 - eps_low, 1 + eps_high]
    clip_eps_high: float = 0.2
    dual_clip: float | None = None  # c > 1: for A < 0 the loss is bounded by -c*A (dual-clip PPO)
    value_loss: str = "huber"  # registry name: mse | huber
    value_clip: float | None = 0.2  # V_old + clip(V - V_old, -c, c); None: no value clipping
    huber_delta: float = 10.0
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    kl_coef: float = 0.0  # KL to a frozen reference policy (k3 estimator); 0: off
    normalize_advantages: str = "rollout"  # ADVANTAGE_NORMALIZATIONS
    max_grad_norm: float | None = 1.0
    actor_lr: float = 1e-4
    critic_lr: float = 1e-3
    lr_schedule: str = "constant"  # LR_SCHEDULES
    # Running mean/std of the rollouts' `state`/`privileged` written into the policy's own normalizers
    # after every update (RL from scratch: it replaces stats a checkpoint brought; needs mean_std).
    obs_normalization: bool = False
    # Rewards divided by the running std of the discounted return, then clipped (SB3 VecNormalize, CleanRL)
    reward_scaling: bool = False
    reward_clip: float = 10.0
    critic_warmup_iters: int = 5  # first iterations update only the critic
    target_kl: float | None = 0.05  # stop the epochs of an update once approx-KL exceeds it
    num_epochs: int = 4
    minibatch_size: int = 256
    # token-mean: every valid element weighs the same; seq-mean-token-mean: every trajectory does
    loss_agg: str = "token-mean"
    group_size: int = 8  # GRPO: envs i with the same i // group_size start from the same state
    # GRPO: keep only groups whose success rate lies in [lo, hi], e.g. (0.1, 0.9); None keeps all
    grpo_success_range: tuple[float, float] | None = None
    eps: float = 1e-6  # added to the std in group and advantage normalization
    # async rollouts (decoupled PPO): cap of the weight pi_prox / pi_behaviour of stale samples; None: no cap
    behaviour_weight_cap: float | None = 5.0
    # -- off-policy (sac) ------------------------------------------------------------------------------
    utd: int = 1  # update-to-data ratio: critic updates per env step (per decision of all envs); RLPD: 10-20
    batch_size: int = 256  # transitions per critic update (online and demo halves together)
    buffer_size: int = 1_000_000  # online transitions kept (the oldest go first)
    learning_starts: int = 5000  # env steps of uniform random actions before the first update
    num_critics: int = 10  # Q ensemble size (LayerNorm MLPs); plain SAC: 2
    critic_subset: int = 2  # target: min over this many critics drawn at random per update (REDQ/RLPD)
    critic_hidden_dims: tuple[int, ...] = (256, 256)
    critic_image_dim: int = 64  # each camera's frozen features projected to this width for the critics
    tau: float = 0.005  # Polyak averaging of the target critics
    init_temperature: float = 1.0
    target_entropy: float | None = None  # None: -(chunk_size * action_dim), i.e. -|A|
    # the largest return any state can earn (1 for a 0/1 success reward that ends the episode): critic
    # targets are clipped to it, so the actor's overestimates cannot compound through bootstrapping
    # (up to their per-step size / (1 - gamma)); None: no clip
    q_max: float | None = None
    # A LeRobot dataset of demonstrations (folder or repo id in LeRobot's cache) held in a demo buffer;
    # each batch then takes `demo_ratio` of its transitions from it (RLPD's symmetric sampling: 0.5)
    demo_dataset: str | None = None
    demo_ratio: float = 0.5
    demo_episodes: int = 0  # the dataset's first N episodes only; 0: all
    # weight of an MSE between the actor's sampled actions and the demo rows' actions in the actor's loss
    # (demos and interventions imitated beside the RL objective); 0: RLPD's pure RL
    bc_weight: float = 0.0
    # Noise-space RL (DSRL, Wagenmaker et al. 2025): a flow policy's checkpoint, kept frozen, whose initial
    # noise the actor picks (train/noise_action_env.py), within [-noise_bound, noise_bound]
    noise_policy: str | None = None
    noise_bound: float = 1.5

    def __post_init__(self) -> None:
        check_choice("algo.name", self.name, ALGORITHMS)
        if self.on_policy:
            check_choice("algo.advantage", self.estimator, registry.names("advantage"))
        if self.name == "grpo" and self.estimator in registry.CRITIC_ADVANTAGES:
            raise ConfigError(
                f"algo.advantage={self.estimator!r} needs a critic, but algo.name='grpo' has none; "
                "use algo.advantage=grpo or algo.name=ppo"
            )
        check_choice("algo.reward_type", self.reward_type, REWARD_TYPES)
        check_choice("algo.value_loss", self.value_loss, registry.names("value_loss"))
        check_choice("algo.loss_agg", self.loss_agg, LOSS_AGGREGATIONS)
        legacy = str(self.normalize_advantages).lower()
        self.normalize_advantages = _LEGACY_ADVANTAGE_NORMALIZATION.get(legacy, self.normalize_advantages)
        check_choice("algo.normalize_advantages", self.normalize_advantages, ADVANTAGE_NORMALIZATIONS)
        check_choice("algo.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _check_unit_interval("algo.gamma", self.gamma)
        _check_unit_interval("algo.gae_lambda", self.gae_lambda)
        check_positive("algo.clip_eps_low", self.clip_eps_low, allow_zero=True)
        check_positive("algo.clip_eps_high", self.clip_eps_high, allow_zero=True)
        if self.clip_eps_low >= 1:
            raise ConfigError(f"algo.clip_eps_low={self.clip_eps_low} must be < 1 (the ratio is positive)")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ConfigError(f"algo.dual_clip={self.dual_clip} must be > 1, or null to turn it off")
        for key in ("value_clip", "max_grad_norm", "target_kl", "behaviour_weight_cap"):
            if getattr(self, key) is not None:
                check_positive(f"algo.{key}", getattr(self, key))
        for key in ("huber_delta", "actor_lr", "critic_lr", "num_epochs", "minibatch_size", "eps"):
            check_positive(f"algo.{key}", getattr(self, key))
        check_positive("algo.reward_clip", self.reward_clip)
        for key in ("value_coef", "entropy_coef", "kl_coef", "critic_warmup_iters"):
            check_positive(f"algo.{key}", getattr(self, key), allow_zero=True)
        if self.group_size < 2:
            raise ConfigError(f"algo.group_size={self.group_size} must be >= 2 (a group needs a baseline)")
        for key in ("utd", "batch_size", "buffer_size", "num_critics", "critic_subset", "init_temperature"):
            check_positive(f"algo.{key}", getattr(self, key))
        check_positive("algo.learning_starts", self.learning_starts, allow_zero=True)
        self.critic_hidden_dims = tuple(self.critic_hidden_dims)  # YAML gives a list
        if self.critic_subset > self.num_critics:
            raise ConfigError(
                f"algo.critic_subset={self.critic_subset} must be <= algo.num_critics={self.num_critics}"
            )
        if not 0 < self.tau <= 1:
            raise ConfigError(f"algo.tau={self.tau} must lie in (0, 1]")
        check_positive("algo.critic_image_dim", self.critic_image_dim)
        check_positive("algo.demo_episodes", self.demo_episodes, allow_zero=True)
        check_positive("algo.bc_weight", self.bc_weight, allow_zero=True)
        if not 0 <= self.demo_ratio < 1:
            raise ConfigError(f"algo.demo_ratio={self.demo_ratio} must lie in [0, 1)")
        check_positive("algo.noise_bound", self.noise_bound)
        if self.noise_policy and self.on_policy:
            raise ConfigError(f"algo.noise_policy trains an off-policy actor, not {self.name}: set algo=sac")
        if self.name == "dsrl_na" and not self.noise_policy:
            raise ConfigError(
                "algo.name=dsrl_na steers a frozen flow policy's noise: set algo.noise_policy=CHECKPOINT"
            )
        if self.noise_policy and self.demo_dataset:
            raise ConfigError("algo.demo_dataset holds env actions, not noise: drop it for algo.noise_policy")
        if self.grpo_success_range is not None:
            self.grpo_success_range = tuple(self.grpo_success_range)  # YAML gives a list
            bounds = self.grpo_success_range
            if len(bounds) != 2 or not 0 <= bounds[0] <= bounds[1] <= 1:
                raise ConfigError(
                    f"algo.grpo_success_range={list(self.grpo_success_range)} must be [lo, hi] with "
                    "0 <= lo <= hi <= 1, or null"
                )

    @property
    def on_policy(self) -> bool:
        """Whether the algorithm updates from the last rollout (train/rl_runner.py) rather than from a
        replay buffer (train/offpolicy_runner.py)."""
        return self.name not in registry.names("off_policy")

    @property
    def estimator(self) -> str:
        """The advantage estimator's registry name: `advantage`, or the algorithm's own when None.

        Derived rather than written back in __post_init__, so that overriding `name` later (as the
        config composition does) also changes the default estimator.
        """
        return self.advantage or DEFAULT_ADVANTAGE[self.name]

    @property
    def uses_critic(self) -> bool:
        """Whether the advantage estimator reads V(s), so a value head is trained."""
        return self.estimator in registry.CRITIC_ADVANTAGES

    @property
    def grouped_rollouts(self) -> bool:
        """Whether the algorithm compares envs that started from the same state (GRPO's groups of
        `group_size` consecutive envs), so every rollout starts from fresh states shared within a group."""
        return self.name == "grpo"

    @property
    def envs_per_initial_state(self) -> int:
        """How many consecutive envs start a rollout from one initial state: a group, or 1 (each its own)."""
        return self.group_size if self.grouped_rollouts else 1

    @property
    def carries_episodes_over(self) -> bool:
        """Whether fixed-length rollout windows may continue unfinished episodes in the next iteration, as
        standard PPO does; grouped rollouts need every member to start together."""
        return not self.grouped_rollouts

    def check_num_envs(self, num_envs: int) -> None:
        """Grouped rollouts need whole groups: `num_envs` a multiple of `group_size`."""
        if num_envs % self.envs_per_initial_state:
            raise ConfigError(
                f"GRPO groups: env.num_envs={num_envs} must be a multiple of "
                f"algo.group_size={self.group_size}"
            )


def _check_unit_interval(key: str, value: float) -> None:
    if not 0 <= value <= 1:
        raise ConfigError(f"{key}={value} must lie in [0, 1]")
