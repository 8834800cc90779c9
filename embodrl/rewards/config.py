"""Reward-model configs (torch-free): what `embodrl reward train` fits; the experiment's `reward` group."""

from __future__ import annotations

from dataclasses import dataclass, field

from embodrl.choices import check_choice, check_positive
from embodrl.errors import ConfigError
from embodrl.policies.vision_config import TOWER_BLOCKS


@dataclass
class RewardConfig:
    """`embodrl train`'s reward: the simulator's, or a learned success classifier's (`reward.model`)."""

    # a checkpoint folder of `embodrl reward train`; "" keeps the simulator's reward. With a model the learner
    # sees a sparse reward (1 where the classifier's probability > threshold) and that prediction as its
    # success, never the simulator's flag (which no longer ends episodes)
    model: str = ""
    threshold: float | None = None  # None: the checkpoint's own
    terminate_on_success: bool = False  # end an episode where the classifier predicts success

    def __post_init__(self) -> None:
        if self.threshold is not None and not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"reward.threshold={self.threshold} must be in (0, 1)")
        if self.terminate_on_success and not self.model:
            raise ConfigError(
                "reward.terminate_on_success needs a learned reward: set reward.model=CHECKPOINT"
            )


# classifier: P(the frame shows the task done); progress: the episode's progress in [0, 1] (VLAC-style: the
# difference between two frames' values is the progress between them, a dense reward)
REWARD_MODELS = ("classifier", "progress")


@dataclass
class RewardTrainConfig:
    """`embodrl reward train DATASET [k=v ...]`: a head on frozen pretrained image features + the state."""

    model: str = "classifier"  # REWARD_MODELS
    out: str = ""  # checkpoint folder to write; "" : runs/reward/<dataset name>-<time>
    obs_keys: tuple[str, ...] = ("rgb", "state")  # policy-style observation keys (rgb, wrist_rgb, state)
    key_map: dict[str, str] = field(default_factory=dict)  # obs key -> dataset feature, as sft.key_map
    tower: str = "efficientnet-lite0"
    blocks: int = 5  # MBConv blocks kept (5: 40 channels at stride 8)
    channels: int = 16  # 1x1 projection of the feature map before it is flattened
    hidden: int = 128
    held_out: float = 0.25  # share of episodes held out (split by episode, positives and negatives each)
    epochs: int = 60
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-2
    balance: bool = True  # weight the (few) success frames up to the others' total in the loss
    # output above which a frame counts as a success (saved with the model); None: 0.5 for a classifier, 0.95
    # for a progress model (the frame before the success is at 1 - 1 / its index)
    threshold: float | None = None
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.tower not in TOWER_BLOCKS:
            raise ConfigError(f"tower={self.tower!r} is not valid; choose one of: {', '.join(TOWER_BLOCKS)}")
        if not 1 <= self.blocks <= len(TOWER_BLOCKS[self.tower]):
            raise ConfigError(f"blocks={self.blocks} must be in [1, {len(TOWER_BLOCKS[self.tower])}]")
        if not 0.0 < self.held_out < 1.0:
            raise ConfigError(f"held_out={self.held_out} must be in (0, 1)")
        check_choice("model", self.model, REWARD_MODELS)
        if self.threshold is not None and not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"threshold={self.threshold} must be in (0, 1)")
        for key in ("channels", "hidden", "epochs", "batch_size", "lr"):
            check_positive(key, getattr(self, key))
        check_positive("weight_decay", self.weight_decay, allow_zero=True)
        unknown = [k for k in self.obs_keys if k not in ("rgb", "wrist_rgb", "state")]
        if unknown or not any(k in ("rgb", "wrist_rgb") for k in self.obs_keys):
            raise ConfigError(
                f"obs_keys={list(self.obs_keys)} must name at least one camera (rgb, wrist_rgb), and state "
                "optionally"
            )

    @property
    def decision_threshold(self) -> float:
        if self.threshold is not None:
            return self.threshold
        return 0.5 if self.model == "classifier" else 0.95
