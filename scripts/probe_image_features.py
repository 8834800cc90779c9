"""Does a policy's image encoder see where the object is? A linear probe on its image features.

Fits ridge regression from the image features of a checkpoint (the CNN's output for the MLP policies,
the projected patch tokens, flattened, for the VLAs) to the tabletop object's position and its offset
from the gripper (`observation.environment_state`), on frames of one dataset (the training demos), and
reports R^2 there and on another dataset (demos from initial states the policy never saw). An encoder
that has learned the scene scores high on the unseen demos; `--features pixels` and `--reinit` give
the baselines of raw pixels and of the same architecture untrained. `--tower NAME` probes a pretrained
tower's feature map (policy.vision.tower, cut after `--blocks`) as it comes, before any training.
`--features condition` probes what a flow VLA's action expert is conditioned on (the prefix of image,
proprioception and instruction, pooled): on a scene with distractors the target is the object the
instruction names, so a high R^2 on unseen demos says the policy grounds its instruction.

    python scripts/probe_image_features.py RUN/checkpoints/last/policy --train data/pick_rgb50 \
        --test data/pick_rgb16_heldout
    python scripts/probe_image_features.py --tower efficientnet-lite0 --blocks 5 --train ... --test ...
    python scripts/probe_image_features.py RUN/checkpoints/last/policy --features condition \
        --train data/lang_pick50 --test data/lang_pick16_heldout
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from embodrl.data.chunk_dataset import ActionChunkDataset
from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.data.lerobot_format import LEROBOT_KEYS
from embodrl.errors import UserError
from embodrl.policies.loading import load_policy
from embodrl.policies.modules.pretrained_tower import PretrainedTower
from embodrl.policies.vision_config import TOWERS, VisionConfig

# `privileged` columns of the tabletop suites: object position (0-2), ..., object - ee (10-12)
TARGETS = {"object x": 0, "object y": 1, "object-ee x": 10, "object-ee y": 11}


def sample_frames(
    root: str, limit: int, image_key: str, policy=None, first_frames: int = 0
) -> tuple[ActionChunkDataset, np.ndarray]:
    """The dataset's frames as chunks of one step, and up to `limit` frame indices (seeded subset; only the
    first `first_frames` of each episode if > 0); with a `policy`, each frame also holds its inputs
    (proprioception, the task id of its instruction)."""
    dataset = LeRobotDataset(root)
    keys, table = [image_key, "privileged"], None
    if policy is not None:
        keys += [k for k in policy.cfg.normalized_keys if k not in (*keys, "task_id")]
        table = policy.cfg.instruction_table or None
    frames = ActionChunkDataset(dataset, 1, obs_keys=keys, instruction_table=table)
    indices = np.arange(dataset.num_frames)
    if first_frames:
        starts = np.asarray([dataset.episode_range(e)[0] for e in range(dataset.num_episodes)])
        indices = indices[indices - starts[dataset.episode_of(indices)] < first_frames]
    if len(indices) <= limit:
        return frames, indices
    return frames, np.sort(np.random.default_rng(0).permutation(indices)[:limit])


@torch.no_grad()
def image_features(policy, batch, image_key: str, kind: str) -> torch.Tensor:
    """[N, F] features of a batch's uint8 images [N, H, W, 3] (or, `condition`, of all its inputs)."""
    images = batch[image_key]
    if kind == "condition":
        if not hasattr(policy, "condition"):
            raise UserError(f"--features condition needs a flow policy, not {policy.family}")
        return policy.condition(batch)[0]
    if kind == "pixels":
        return images.float().flatten(1) / 255
    if isinstance(policy, PretrainedTower):
        return policy(images).flatten(1)
    encoder = getattr(policy, "encoder", None)
    if encoder is not None and image_key in encoder.images:  # MLP policies: the CNN's (or tower's) output
        return encoder.images[image_key](images).flatten(1)
    prefix = getattr(policy, "prefix_encoder", None)
    if prefix is not None:  # VLAs: the patch tokens the language model reads, flattened
        return prefix.backbone.encode_images(images).flatten(1)
    raise UserError(f"the {policy.family} policy has no image encoder for {image_key!r}")


def image_size(root: str, image_key: str) -> int:
    """The height of a dataset's frames of camera `image_key`."""
    return LeRobotDataset(root).features[LEROBOT_KEYS[image_key]]["shape"][0]


def features_and_targets(policy, root: str, limit: int, image_key: str, kind: str, first_frames: int = 0):
    reader = policy if kind == "condition" else None
    frames, indices = sample_frames(root, limit, image_key, reader, first_frames)
    features, targets = [], []
    for start in range(0, len(indices), 64):
        batch = frames.__getitems__(indices[start : start + 64].tolist())
        features.append(image_features(policy, batch, image_key, kind).double())
        targets.append(batch["privileged"][:, list(TARGETS.values())].double())
    return torch.cat(features).numpy(), torch.cat(targets).numpy()


def r_squared(predicted: np.ndarray, target: np.ndarray) -> np.ndarray:
    return 1 - ((predicted - target) ** 2).sum(0) / ((target - target.mean(0)) ** 2).sum(0)


def main(argv: list[str] | None = None) -> dict[float, dict[str, list[float]]]:
    """Prints, and returns, {lambda: {"fitted": R^2 per target, "unseen": R^2 per target}}."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("checkpoint", nargs="?", help="a policy directory (RUN/checkpoints/last/policy)")
    parser.add_argument("--tower", choices=TOWERS[1:], help="probe this pretrained tower instead of a policy")
    parser.add_argument("--blocks", type=int, default=VisionConfig.blocks, help="blocks kept of --tower")
    parser.add_argument("--train", required=True, help="dataset the probe is fitted on (the policy's demos)")
    parser.add_argument("--test", required=True, help="dataset of unseen demos the probe is scored on")
    parser.add_argument("--max-train", type=int, default=3000, help="frames fitted on (a seeded subset)")
    parser.add_argument("--features", choices=["image", "pixels", "condition"], default="image")
    parser.add_argument("--reinit", action="store_true", help="the untrained encoder (fresh initial weights)")
    parser.add_argument("--lambdas", type=float, nargs="+", default=[100.0, 1000.0, 10000.0])
    parser.add_argument("--image-key", default="rgb")
    parser.add_argument(
        "--first-frames",
        type=int,
        default=0,
        help="only each episode's first K frames: before the hand moves toward the named object, which "
        "would give it away",
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    if args.tower:
        policy = PretrainedTower(
            VisionConfig(args.tower, args.blocks), image_size(args.train, args.image_key)
        )
    elif args.checkpoint:
        policy = load_policy(args.checkpoint).eval()
    else:
        raise UserError("name a policy checkpoint, or a pretrained --tower")
    if args.reinit and not args.tower:  # the same architecture as its constructor initialises it
        policy = type(policy)(policy.cfg, policy.obs_shapes).eval()
    key, kind, first = args.image_key, args.features, args.first_frames
    x_fit, y_fit = features_and_targets(policy, args.train, args.max_train, key, kind, first)
    x_test, y_test = features_and_targets(policy, args.test, 10**9, key, kind, first)
    mean, std = x_fit.mean(0), x_fit.std(0) + 1e-6
    x_fit, x_test = (x_fit - mean) / std, (x_test - mean) / std
    y_mean = y_fit.mean(0)
    gram = x_fit @ x_fit.T  # ridge in its dual form: features may outnumber frames (VLA tokens)
    cross = x_test @ x_fit.T  # the unseen frames' kernel rows, the same for every lambda
    results = {}
    print(f"{len(x_fit)} frames fitted, {len(x_test)} unseen, {x_fit.shape[1]} features; R^2:", list(TARGETS))
    for lam in args.lambdas:
        alpha = np.linalg.solve(gram + lam * np.eye(len(gram)), y_fit - y_mean)
        fitted, unseen = gram @ alpha + y_mean, cross @ alpha + y_mean
        results[lam] = {
            "fitted": np.round(r_squared(fitted, y_fit), 3).tolist(),
            "unseen": np.round(r_squared(unseen, y_test), 3).tolist(),
        }
        print(f"lambda {lam:g}: fitted {results[lam]['fitted']}, unseen {results[lam]['unseen']}")
    return results


if __name__ == "__main__":
    try:
        main()
    except UserError as error:  # bad input: one line, as the CLI gives it, not a traceback
        raise SystemExit(f"probe_image_features: {error}") from None
