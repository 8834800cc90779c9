"""Validation on held-out episodes of a dataset: what SFT reports when no simulator can play the policy.

Two numbers per evaluation: the SFT loss on the held-out frames, and the mean absolute error of the policy's
deterministic action chunk against the recorded one (in the dataset's action units, padded steps left out).
Both are deterministic (fixed noise draws) and leave the training run's random state untouched, so a resumed
run logs the same values.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from embodrl.data.chunk_dataset import ActionChunkDataset
from embodrl.errors import UserError

VALIDATION_SEED = 12345


def held_out_episodes(num_episodes: int, val_episodes: int) -> list[int]:
    """The episodes kept out of training: the last `val_episodes` (-1: a tenth, at least one when there are
    two or more; 0: none)."""
    if val_episodes < 0:
        val_episodes = max(1, num_episodes // 10) if num_episodes >= 2 else 0
    if val_episodes >= num_episodes and val_episodes > 0:
        raise UserError(
            f"sft.val_episodes={val_episodes} leaves no training episodes of {num_episodes}; lower it"
        )
    return list(range(num_episodes - val_episodes, num_episodes))


@torch.no_grad()
def validation_metrics(
    policy: nn.Module, samples: ActionChunkDataset, frames: Sequence[int], batch_size: int, device: str
) -> dict[str, float]:
    """{"val/loss", "val/action_mae"} of `policy` on `samples[frames]`."""
    was_training = policy.training
    loss_sum, error_sum, error_count = 0.0, 0.0, 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(VALIDATION_SEED)
        for start in range(0, len(frames), batch_size):
            batch = samples.__getitems__(list(frames[start : start + batch_size])).to(device)
            n = batch.batch_size[0]
            policy.train()  # the SFT loss as training computes it (its augmentation included)
            loss_sum += float(policy.sft_loss(batch)) * n
            policy.eval()
            actions = policy.act(batch, deterministic=True).actions  # [B, C, A]
            valid = ~batch["action_is_pad"]  # [B, C]
            error = (actions.float() - batch["action"].float()).abs()[valid]
            error_sum += float(error.sum())
            error_count += error.numel()
    policy.train(was_training)
    return {"val/loss": loss_sum / max(len(frames), 1), "val/action_mae": error_sum / max(error_count, 1)}
