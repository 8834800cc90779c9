"""Training-loop configuration (torch-free; composed into the experiment config as `train`)."""

from dataclasses import dataclass

from embodrl.choices import check_positive


@dataclass
class TrainConfig:
    """How long to train, how often to evaluate and checkpoint, where to log."""

    iterations: int = 200
    # Decisions per env per iteration; 0 = enough for one full episode (ceil(max_episode_steps / chunk)).
    rollout_steps: int = 0
    eval_every: int = 10  # iterations; 0 turns periodic evaluation off (a final one always runs)
    eval_episodes: int = 50
    eval_envs: int = 0  # envs for evaluation; 0 = env.num_envs
    save_every: int = 10  # iterations between checkpoints
    tensorboard: bool = True
    torch_threads: int = 0  # 0 leaves torch's default (one per core)

    def __post_init__(self) -> None:
        check_positive("train.iterations", self.iterations)
        for key in ("rollout_steps", "eval_every", "eval_envs", "torch_threads"):
            check_positive(f"train.{key}", getattr(self, key), allow_zero=True)
        check_positive("train.eval_episodes", self.eval_episodes)
        check_positive("train.save_every", self.save_every)
