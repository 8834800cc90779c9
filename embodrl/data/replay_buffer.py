"""The replay buffer of off-policy learning: a ring of transitions, and demonstrations read as transitions.

A transition is one decision: `obs` and `next_obs` (TensorDicts of the observation keys the learner
reads), `action` [C, A] in env units, `reward` (the chunk's summed reward) and `terminated` (the MDP ended:
no bootstrap from `next_obs`; a time limit is not an end). Its state (`state_dict`) holds plain tensors,
so a checkpoint's trainer state stores it and loads it with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from tensordict import TensorDict

from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.data.lerobot_format import ACTION_KEY, LEROBOT_KEYS
from embodrl.errors import UserError
from embodrl.obs_keys import IMAGE_KEYS, VECTOR_KEYS

REWARD_FEATURE, DONE_FEATURE = "next.reward", "next.done"  # LeRobot's names, where a dataset has them
INTERVENTION_FEATURE = "teleop"  # `embodrl deploy`'s recordings: the steps a human drove


class ReplayBuffer:
    """Up to `capacity` transitions; once full, each new one replaces the oldest. Storage is allocated at
    the first `add`, shaped like what it receives."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.data: TensorDict | None = None
        self.cursor = 0  # the row the next transition goes to
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, transitions: TensorDict) -> None:
        """Append a batch [B] of transitions."""
        count = transitions.batch_size[0]
        if self.data is None:
            self.data = transitions.apply(
                lambda v: v.new_zeros((self.capacity, *v.shape[1:])), batch_size=[self.capacity]
            )
        if count > self.capacity:  # only the newest fit; the others would be replaced at once
            self.cursor = (self.cursor + count - self.capacity) % self.capacity
            transitions, count = transitions[-self.capacity :], self.capacity
        self.data[(self.cursor + torch.arange(count)) % self.capacity] = transitions
        self.cursor = (self.cursor + count) % self.capacity
        self.size = min(self.size + count, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator) -> TensorDict:
        """`batch_size` transitions drawn uniformly with replacement (indices from `generator`)."""
        if self.size == 0:
            raise UserError("cannot sample from an empty replay buffer")
        return self.data[torch.randint(self.size, (batch_size,), generator=generator)]

    def state_dict(self) -> dict:
        """The filled rows (as nested dicts of tensors) and the ring's position."""
        # a copy: saving a view of the rows would write the whole preallocated storage
        data = {} if self.data is None else self.data[: self.size].clone().to_dict()
        return {"data": data, "cursor": self.cursor, "size": self.size, "capacity": self.capacity}

    def load_state_dict(self, state: Mapping) -> None:
        if state["capacity"] != self.capacity:
            raise UserError(
                f"the checkpoint's replay buffer holds up to {state['capacity']} transitions, this run's "
                f"{self.capacity}: resume with the same algo.buffer_size"
            )
        self.data, self.cursor, self.size = None, 0, 0
        if state["size"]:
            self.add(TensorDict.from_dict(state["data"], batch_size=[state["size"]]))
        self.cursor = state["cursor"]


def step_transitions(
    obs: TensorDict,
    actions: torch.Tensor,
    reward: torch.Tensor,
    next_obs: TensorDict,
    terminated: torch.Tensor,
) -> TensorDict:
    """One decision of each of N envs as the buffer keeps it: `reward` [N, C] is summed over the chunk, and
    `next_obs` is the finished episode's last observation where an env auto-reset."""
    return TensorDict(
        {
            "obs": obs,
            "action": actions.float(),
            "reward": reward.sum(-1).float(),
            "next_obs": next_obs,
            "terminated": terminated.bool(),
        },
        batch_size=[actions.shape[0]],
    )


def mixed_batch(
    online: ReplayBuffer,
    demos: ReplayBuffer | None,
    batch_size: int,
    demo_ratio: float,
    generator: torch.Generator,
) -> TensorDict:
    """A batch with round(batch_size * demo_ratio) transitions from `demos` (none while it is empty) and the
    rest from `online`: RLPD's symmetric sampling at demo_ratio 0.5. `demo` [B] marks the demos' rows."""
    from_demos = round(batch_size * demo_ratio) if demos is not None and len(demos) else 0
    batch = online.sample(batch_size - from_demos, generator)
    if from_demos:
        batch = torch.cat([batch, demos.sample(from_demos, generator)])
    batch["demo"] = torch.arange(batch_size, device=batch.device) >= batch_size - from_demos
    return batch


def demo_transitions(
    root: str,
    keys: tuple[str, ...],
    episodes: int = 0,
    camera_features: Callable[[TensorDict], TensorDict] | None = None,
) -> TensorDict:
    """A LeRobot dataset's frames as transitions [frames] with the observation `keys` (under embodrl's
    dataset names: observation.state, observation.images.main, ...) and single-action chunks [1, A].

    Cameras are stored as what `camera_features` makes of a batch of their uint8 frames (a policy's frozen
    image features), as the online replay buffer stores them. `episodes` > 0 keeps the first that many.
    Rewards and ends come from the dataset's `next.reward` / `next.done` where it has them; otherwise
    every episode counts as a success that ended the MDP on its last frame, with reward 1 there and 0
    elsewhere (what `embodrl collect` keeps, under env.reward=sparse). A last frame's next observation
    is itself, which its end masks out. A recording with an intervention flag (`teleop`, what `embodrl
    deploy` marks while a human drives) gives only the flagged frames: the human's corrections.
    """
    others = [key for key in keys if key not in VECTOR_KEYS and key not in IMAGE_KEYS]
    if others:
        raise UserError(f"demo transitions carry vectors and cameras only; {others} are neither")
    cameras = [key for key in keys if key in IMAGE_KEYS]
    if cameras and camera_features is None:
        raise UserError(f"demo transitions keep cameras {cameras} as frozen features, and none were given")
    dataset = LeRobotDataset(root)
    count = dataset.num_episodes if episodes <= 0 else min(episodes, dataset.num_episodes)
    frames = dataset.episode_range(count - 1)[1]
    obs = {
        key: torch.tensor(dataset.column(LEROBOT_KEYS[key])[:frames], dtype=torch.float32)
        for key in keys
        if key in VECTOR_KEYS
    }
    if cameras:
        obs |= _camera_features(dataset, cameras, count, camera_features).to_dict()
    last = np.zeros(frames, dtype=bool)
    last[[dataset.episode_range(e)[1] - 1 for e in range(count)]] = True
    if REWARD_FEATURE in dataset.features:
        reward = dataset.column(REWARD_FEATURE)[:frames].reshape(frames)
    else:
        reward = last.astype(np.float32)
    terminated = (
        dataset.column(DONE_FEATURE)[:frames].reshape(frames) if DONE_FEATURE in dataset.features else last
    )
    following = np.where(last, np.arange(frames), np.arange(frames) + 1)  # the next frame of the episode
    action = torch.tensor(dataset.column(ACTION_KEY)[:frames], dtype=torch.float32)
    transitions = TensorDict(
        {
            "obs": obs,
            "action": action.reshape(frames, 1, -1),
            "reward": torch.tensor(reward, dtype=torch.float32),
            "next_obs": {key: value[torch.as_tensor(following)] for key, value in obs.items()},
            "terminated": torch.tensor(terminated, dtype=torch.bool),
        },
        batch_size=[frames],
    )
    if INTERVENTION_FEATURE in dataset.features:
        flagged = dataset.column(INTERVENTION_FEATURE)[:frames].reshape(frames).astype(bool)
        transitions = transitions[torch.as_tensor(flagged)]
    return transitions


def _camera_features(
    dataset: LeRobotDataset,
    cameras: list[str],
    episodes: int,
    camera_features: Callable[[TensorDict], TensorDict],
    batch: int = 256,
) -> TensorDict:
    """{camera: features [frames, ...]} of the first `episodes` episodes, decoded one episode at a time."""
    parts = []
    for e in range(episodes):
        images = {key: torch.from_numpy(dataset.camera_frames(LEROBOT_KEYS[key], e)) for key in cameras}
        length = len(next(iter(images.values())))
        for i in range(0, length, batch):
            chunk = TensorDict(
                {k: v[i : i + batch] for k, v in images.items()}, batch_size=[min(batch, length - i)]
            )
            parts.append(camera_features(chunk).cpu())
    return torch.cat(parts)
