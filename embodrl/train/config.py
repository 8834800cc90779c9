"""Training-loop configuration (torch-free; composed into the experiment config as `train`)."""

from dataclasses import dataclass, field

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError

PRECISIONS = ("fp32", "bf16")


@dataclass
class TrainConfig:
    """How long to train, how often to evaluate and checkpoint, where to log."""

    iterations: int = 200
    # Decisions per env per iteration. 0: enough for one full episode (ceil(max_episode_steps / chunk)),
    # every iteration starting from fresh initial states (exact resume). > 0: fixed windows that carry
    # episodes across iterations, as standard PPO does (GRPO always starts from fresh group states).
    rollout_steps: int = 0
    eval_every: int = 10  # iterations; 0 turns periodic evaluation off (a final one always runs)
    eval_episodes: int = 50
    eval_envs: int = 0  # envs for evaluation; 0 = env.num_envs
    videos: int = 2  # episodes of the final evaluation saved as mp4 in <run>/videos; 0: none
    save_every: int = 10  # iterations between checkpoints
    # Earlier checkpoints kept besides checkpoints/last, as checkpoints/<iteration or SFT step>/ (hard
    # links to last's files: no extra disk until last is replaced); the oldest go first. 0: last only.
    keep_checkpoints: int = 0
    # checkpoints/best: the policy of the best evaluation (success, then return), played once more at the
    # end on eval_episodes held-out initial states (best_eval.json) when it is not the last policy
    keep_best: bool = True
    tensorboard: bool = True
    # Weights & Biases (pip install 'embodrl[wandb]'): metrics of every iteration, the resolved config;
    # runs grouped by the experiment's name; a resumed run continues its wandb run
    wandb: bool = False
    wandb_project: str = "embodrl"
    wandb_entity: str = ""  # "" = your default entity
    torch_threads: int = 0  # 0 leaves torch's default (one per core)
    # bf16 autocasts the forward passes of the PPO update (CUDA, or CPUs with bf16 support); the loss and
    # the log-prob ratio stay fp32. The rollout acts in fp32, so the first-minibatch ratio is ~1, not 1.
    precision: str = "fp32"

    def __post_init__(self) -> None:
        check_choice("train.precision", self.precision, PRECISIONS)
        check_positive("train.iterations", self.iterations)
        for key in (
            "rollout_steps",
            "eval_every",
            "eval_envs",
            "videos",
            "torch_threads",
            "keep_checkpoints",
        ):
            check_positive(f"train.{key}", getattr(self, key), allow_zero=True)
        check_positive("train.eval_episodes", self.eval_episodes)
        check_positive("train.save_every", self.save_every)


SFT_SOURCES = ("dataset", "expert")


@dataclass
class SFTConfig:
    """Behaviour cloning from a LeRobotDataset v3 folder, or from the scripted expert played live."""

    dataset: str = ""  # folder written by `embodrl collect` (or any LeRobotDataset v3)
    # Few-shot: train on the dataset's first k episodes only (`embodrl collect` writes tasks one after
    # another, so collect k per task for a multi-task few-shot set); 0 = all episodes.
    max_episodes: int = 0
    steps: int = 4000
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 100  # linear warm-up, then cosine decay to 0 at `steps`
    max_grad_norm: float = 1.0
    precision: str = "fp32"  # bf16 autocasts the forward pass (CUDA, or CPUs with bf16 support)
    eval_every: int = 1000  # steps; 0 turns periodic evaluation off (a final one always runs)
    eval_episodes: int = 50
    videos: int = 2  # episodes of the final evaluation saved as mp4 in <run>/videos; 0: none
    save_every: int = 1000
    keep_best: bool = True  # checkpoints/best and its held-out evaluation, as train.keep_best
    num_workers: int = 0  # DataLoader worker processes
    # Which dataset feature feeds a policy input, where the names differ from embodrl's defaults
    # (observation.images.main, observation.state, ...), e.g. {rgb: observation.images.front}.
    key_map: dict[str, str] = field(default_factory=dict)
    # env=none (no simulator): episodes held out of training for the validation loss and action error;
    # the last ones of the dataset (-1: a tenth of them, at least one)
    val_episodes: int = -1
    # Where samples come from: "dataset" (sft.dataset), or "expert": the env's scripted expert played live
    # (`embodrl pretrain`), its successful episodes kept in a pool of the latest `stream_pool` samples,
    # each drawn `stream_reuse` times on average, from the `stream_states` initial states that start at
    # `stream_first_state_id` (by default between the evaluations' 0.. and `embodrl collect`'s 50000..);
    # `stream_perturb`: per step, the probability that a burst of `stream_perturb_steps` steps pushes the
    # expert's executed moves off course, so that the samples after it show how it steers back (0: none);
    # `stream_policy_share`: the share of episodes the policy being trained plays itself, every step
    # labelled with the expert's action in the state it reached (DAgger; 0: the expert plays them all)
    source: str = "dataset"
    stream_pool: int = 16384
    stream_reuse: float = 2.0
    stream_first_state_id: int = 1000
    stream_states: int = 49000
    stream_perturb: float = 0.0
    stream_perturb_steps: int = 3
    stream_policy_share: float = 0.0

    def __post_init__(self) -> None:
        check_choice("sft.precision", self.precision, PRECISIONS)
        check_choice("sft.source", self.source, SFT_SOURCES)
        for key in ("stream_pool", "stream_reuse", "stream_states", "stream_perturb_steps"):
            check_positive(f"sft.{key}", getattr(self, key))
        if not 0.0 <= self.stream_perturb < 1.0:
            raise ConfigError(f"sft.stream_perturb={self.stream_perturb}: give a probability in [0, 1)")
        if not 0.0 <= self.stream_policy_share <= 1.0:
            raise ConfigError(f"sft.stream_policy_share={self.stream_policy_share}: give a share in [0, 1]")
        check_positive("sft.stream_first_state_id", self.stream_first_state_id, allow_zero=True)
        if self.val_episodes < -1:
            raise ConfigError(f"sft.val_episodes={self.val_episodes}: give a count >= 0, or -1 for a tenth")
        for key in ("steps", "batch_size", "lr", "eval_episodes", "save_every", "max_grad_norm"):
            check_positive(f"sft.{key}", getattr(self, key))
        for key in ("max_episodes", "weight_decay", "warmup_steps", "eval_every", "videos", "num_workers"):
            check_positive(f"sft.{key}", getattr(self, key), allow_zero=True)
