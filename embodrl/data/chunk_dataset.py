"""Training samples from a LeRobot dataset: the observation at frame t and the action chunk t..t+C-1."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from tensordict import TensorDict
from torch.utils.data import Dataset

from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.data.lerobot_format import ACTION_KEY, LEROBOT_KEYS
from embodrl.errors import UserError


class ActionChunkDataset(Dataset):
    """Samples {obs keys, action [C, A], action_is_pad [C], instruction, task_index(, task_id)}.

    Like LeRobot's delta_timestamps, steps past the episode end repeat the last action and are
    flagged in `action_is_pad`. Images are uint8 [H, W, 3]. With `instruction_table` (the env's),
    samples also carry `task_id`, the index of their instruction in that table; with `episodes` (those
    whose samples will be read) only their instructions must be the env's (replaying one task of a
    multi-task dataset in an env built for that task).
    `key_map` overrides which dataset feature feeds an obs key (e.g. {"rgb": "observation.images.top"}).
    """

    def __init__(
        self,
        dataset: LeRobotDataset,
        chunk_size: int,
        obs_keys: Sequence[str] = ("state",),
        action_dim: int | None = None,
        instruction_table: Sequence[str] | None = None,
        key_map: Mapping[str, str] | None = None,
        preload_images: bool = True,
        episodes: Sequence[int] | None = None,
    ):
        if chunk_size <= 0:
            raise UserError(f"chunk_size must be > 0, got {chunk_size}")
        self.dataset, self.chunk_size = dataset, chunk_size
        self.key_map = {**LEROBOT_KEYS, **(key_map or {})}
        missing = [k for k in (*obs_keys, ACTION_KEY) if self.key_map.get(k, k) not in dataset.features]
        if missing:
            wanted = {k: self.key_map.get(k, k) for k in missing}
            raise UserError(
                f"dataset {dataset.root} lacks features {wanted}; it has {sorted(dataset.features)} "
                "(collect with the obs keys the policy reads, or map them with sft.key_map, e.g. "
                "'sft.key_map={rgb: observation.images.front}')"
            )
        self.obs_keys = tuple(obs_keys)
        self.actions = dataset.column(ACTION_KEY).astype(np.float32)  # [F, A]
        if self.actions.ndim != 2:
            raise UserError(
                f"dataset actions must be vectors [A], got per-frame shape {self.actions.shape[1:]}"
            )
        if action_dim is not None and self.actions.shape[1] != action_dim:
            raise UserError(
                f"dataset actions have {self.actions.shape[1]} dimensions; the policy expects {action_dim} "
                "(policy.action_dim must match the env's action space the demos were recorded in)"
            )
        frames = np.arange(dataset.num_frames)
        episode = dataset.episode_of(frames)
        self.episode_end = np.asarray(
            [dataset.episode_range(int(e))[1] for e in range(dataset.num_episodes)]
        )[episode]  # [F]: one past the last frame of each frame's episode
        self.task_index = dataset.column("task_index").astype(np.int64)
        self.task_id = None
        if instruction_table is not None:
            table = {text: i for i, text in enumerate(instruction_table)}
            read = self.task_index if episodes is None else self.task_index[np.isin(episode, episodes)]
            unknown = sorted({dataset.tasks[i] for i in np.unique(read)} - set(table))
            if unknown:
                raise UserError(f"dataset tasks {unknown[:3]} are not instructions of this env")
            ids = [table.get(t, -1) for t in dataset.tasks]  # -1: an episode that is never read
            self.task_id = np.asarray(ids, dtype=np.int64)[self.task_index]
        self.images: dict[str, np.ndarray] = {}
        if preload_images:
            for key in self.obs_keys:
                name = self.key_map.get(key, key)
                if name in dataset.camera_keys:  # decode every episode once: [F, H, W, 3] uint8
                    self.images[key] = np.concatenate(
                        [dataset.camera_frames(name, e) for e in range(dataset.num_episodes)]
                    )

    def __len__(self) -> int:
        return self.dataset.num_frames

    def __getitem__(self, index: int) -> dict:
        batch = self.__getitems__([index])
        sample = {key: value[0] for key, value in batch.items() if key != "instruction"}
        sample["instruction"] = batch["instruction"][0]
        return sample

    def __getitems__(self, indices: Sequence[int]) -> TensorDict:
        """A whole batch gathered with array indexing (the DataLoader calls this instead of B getitems)."""
        index = np.asarray(indices, dtype=np.int64)  # [B]
        end = self.episode_end[index][:, None]  # [B, 1]
        steps = index[:, None] + np.arange(self.chunk_size)  # [B, C]
        is_pad = steps >= end
        steps = np.minimum(steps, end - 1)
        batch = {
            "action": torch.from_numpy(self.actions[steps]),  # [B, C, A]
            "action_is_pad": torch.from_numpy(is_pad),  # [B, C]
            "task_index": torch.from_numpy(self.task_index[index]),
        }
        if self.task_id is not None:
            batch["task_id"] = torch.from_numpy(self.task_id[index])
        for key in self.obs_keys:
            name = self.key_map.get(key, key)
            if key in self.images:
                batch[key] = torch.from_numpy(self.images[key][index])
            elif name in self.dataset.camera_keys:
                batch[key] = torch.from_numpy(np.stack([self.dataset.frame(int(i))[name] for i in index]))
            else:
                batch[key] = torch.from_numpy(self.dataset.column(name)[index].astype(np.float32))
        out = TensorDict(batch, batch_size=[len(index)])
        out["instruction"] = [self.dataset.tasks[t] for t in self.task_index[index]]
        return out

    def normalization_stats(self) -> dict[str, dict[str, np.ndarray]]:
        """meta/stats.json entries for the action and the vector obs keys, under the env's key names."""
        keys = [
            k for k in (*self.obs_keys, ACTION_KEY) if self.key_map.get(k, k) not in self.dataset.camera_keys
        ]
        return {
            k: self.dataset.stats[self.key_map.get(k, k)]
            for k in keys
            if self.key_map.get(k, k) in self.dataset.stats
        }


def collate_chunks(samples: list[dict] | TensorDict) -> TensorDict:
    """Stack samples into a TensorDict [B] (instructions become a list of B strings).

    A batch from `ActionChunkDataset.__getitems__` is already a TensorDict and passes through.
    """
    if isinstance(samples, TensorDict):
        return samples
    batch = {key: torch.stack([s[key] for s in samples]) for key in samples[0] if key != "instruction"}
    batch["instruction"] = [s["instruction"] for s in samples]
    return TensorDict(batch, batch_size=[len(samples)])
