"""Shuffled mini-batches whose order depends only on the seed and the step: exact resume mid-epoch."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from embodrl.errors import UserError


class ShuffledBatches(Sampler[list[int]]):
    """Endless batches of indices into `num_samples` samples, each epoch in its own random order.

    Epoch e's order is a permutation drawn from (seed, e) alone, so the batch of any step is known without
    replaying the steps before it: a run resumed at step k continues with the batch an uninterrupted run
    draws at step k. With `drop_last` an epoch ends before a short last batch; otherwise it ends with it.
    """

    def __init__(
        self, num_samples: int, batch_size: int, seed: int, drop_last: bool = True, first_step: int = 0
    ) -> None:
        if num_samples <= 0:
            raise UserError("no samples to draw batches from (the dataset has no frames)")
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.drop_last = drop_last and num_samples >= batch_size
        self.first_step = first_step

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.num_samples, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def epoch_order(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def __iter__(self) -> Iterator[list[int]]:
        step, epoch, order = self.first_step, -1, torch.empty(0, dtype=torch.long)
        while True:
            current, k = divmod(step, self.batches_per_epoch)
            if current != epoch:
                epoch, order = current, self.epoch_order(current)
            yield order[k * self.batch_size : (k + 1) * self.batch_size].tolist()
            step += 1
