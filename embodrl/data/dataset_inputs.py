"""A policy's inputs read off a dataset alone (SFT without a simulator): which feature feeds each observation
key, the shapes, the action size and the tasks.

A robot's dataset names its cameras after the robot (`observation.images.front`, `...wrist`) and its state
after its motors; without a simulator to say what the policy observes, the dataset says it. Cameras are
matched by name unless `key_map` names them: `wrist_rgb` is the camera whose name contains "wrist", `rgb` the
first other camera.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.data.lerobot_format import ACTION_KEY, LEROBOT_KEYS
from embodrl.errors import UserError
from embodrl.obs_keys import IMAGE_KEYS, PRIVILEGED, STATE, TASK_ID, WRIST_RGB

log = logging.getLogger(__name__)

WRIST_MARK = "wrist"


@dataclass(frozen=True)
class DatasetInputs:
    """What a dataset gives a policy: obs key -> feature name, obs key -> per-sample shape, the action size
    and the task strings (the instruction table that `task_id` indexes)."""

    features: dict[str, str]
    shapes: dict[str, tuple[int, ...]]
    action_dim: int
    tasks: tuple[str, ...]


def _camera_for(key: str, cameras: Sequence[str], taken: set[str]) -> str:
    """The dataset camera that feeds image key `key` when `sft.key_map` does not say."""
    free = [c for c in cameras if c not in taken]
    if key == WRIST_RGB:
        found = [c for c in free if WRIST_MARK in c.rsplit(".", 1)[-1]]
    else:
        found = [c for c in free if WRIST_MARK not in c.rsplit(".", 1)[-1]] or free[:1]
    if not found:
        raise UserError(
            f"the policy reads {key!r} but no camera of the dataset fits it (cameras: {list(cameras)}); "
            f"name one with 'sft.key_map={{{key}: <camera feature>}}'"
        )
    if len(found) > 1:
        log.info("%s <- %s (of cameras %s; sft.key_map picks another)", key, found[0], list(cameras))
    return found[0]


def dataset_inputs(
    dataset: LeRobotDataset, obs_keys: Sequence[str], key_map: Mapping[str, str] | None = None
) -> DatasetInputs:
    """Resolve the policy's `obs_keys` against `dataset`'s features (explicit `key_map` entries first)."""
    key_map = dict(key_map or {})
    if PRIVILEGED in obs_keys:
        raise UserError(
            "the policy reads 'privileged' simulator state, which a dataset without a simulator does not "
            "have; drop it from policy.obs_keys / value_obs_keys / sft_aux_keys"
        )
    features: dict[str, str] = {}
    taken = {key_map[k] for k in IMAGE_KEYS if k in key_map}
    for key in obs_keys:
        if key == TASK_ID:
            continue  # the dataset's task_index
        if key in key_map:
            name = key_map[key]
        elif key in IMAGE_KEYS:
            name = _camera_for(key, dataset.camera_keys, taken)
        else:
            name = LEROBOT_KEYS[key] if key == STATE else key
        if name not in dataset.features:
            raise UserError(
                f"the policy's {key!r} input maps to {name!r}, which {dataset.root} lacks; its features: "
                f"{sorted(dataset.features)} (map it with 'sft.key_map={{{key}: <feature>}}')"
            )
        features[key] = name
        taken.add(name)
    for key, name in features.items():
        is_camera = name in dataset.camera_keys
        if is_camera != (key in IMAGE_KEYS):
            kind = "a camera" if is_camera else "not a camera"
            raise UserError(f"sft.key_map maps {key!r} to {name!r}, which is {kind}")
    shapes = {key: tuple(int(s) for s in dataset.features[name]["shape"]) for key, name in features.items()}
    for key, shape in shapes.items():
        if key in IMAGE_KEYS and (len(shape) != 3 or shape[2] != 3):
            raise UserError(f"camera {features[key]!r} has shape {list(shape)}; expected [H, W, 3]")
        if key == STATE and len(shape) != 1:
            raise UserError(f"{features[key]!r} has shape {list(shape)}; the state must be a vector")
    if ACTION_KEY not in dataset.features:
        raise UserError(f"{dataset.root} has no {ACTION_KEY!r} feature to imitate")
    action_shape = dataset.features[ACTION_KEY]["shape"]
    if len(action_shape) != 1:
        raise UserError(f"dataset actions must be vectors [A]; {dataset.root} has shape {list(action_shape)}")
    if TASK_ID in obs_keys:
        shapes[TASK_ID] = ()
    return DatasetInputs(features, shapes, int(action_shape[0]), tuple(dataset.tasks))
