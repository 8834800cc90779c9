"""A copy of a LeRobot demo dataset whose actions are smoothed by a centered moving average, per episode.

A scripted expert that switches its velocity between -1, 0 and 1 (bang-bang) teaches a policy the same
steps, which hide what chunk-seam methods change (benchmarks/rtc_latency.py). This writes a new dataset
whose action dims are averaged over a centered window of `--window` frames inside each episode (fewer
frames at its ends, never across episodes); the dims named by `--keep` (default: the gripper, whose
switch is deliberate) stay as they were, and so does every other feature. The smoothed actions are not
the ones the expert executed: the states were reached with the original actions, so the policy imitates
a softer controller than the one demonstrated (state it beside any result).

    python scripts/smooth_demo_actions.py data/rtc_pick_demos --out data/rtc_pick_demos_ma3 --window 3
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.data.lerobot_format import DEFAULT_FEATURES
from embodrl.data.lerobot_writer import EPISODE_COLUMNS, LeRobotDatasetWriter
from embodrl.errors import UserError

ACTION_KEY = "action"


def centered_moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """The mean of each row [T, D] and its (window - 1) / 2 neighbours on each side, over the rows that
    exist (the window shrinks at both ends instead of padding)."""
    half = window // 2
    sums = np.cumsum(np.pad(values.astype(np.float64), ((1, 0), (0, 0))), axis=0)  # sums[t] = sum of rows < t
    t = np.arange(len(values))
    low, high = np.maximum(t - half, 0), np.minimum(t + half + 1, len(values))
    return (sums[high] - sums[low]) / (high - low)[:, None]


def smoothed_dims(names: list[str] | None, action_dim: int, keep: list[str]) -> np.ndarray:
    """The action dims to smooth: all but those named in `keep` (UserError for a name the action lacks)."""
    names = names or [str(i) for i in range(action_dim)]
    unknown = [name for name in keep if name not in names]
    if unknown:
        raise UserError(f"--keep {unknown}: the action's dims are {names}")
    return np.array([i for i, name in enumerate(names) if name not in keep], dtype=np.int64)


def smooth_dataset(source: str, out: str, window: int, keep: list[str]) -> int:
    """Write the smoothed copy of `source` to `out`; returns the number of episodes."""
    if window < 3 or window % 2 == 0:
        raise UserError(f"--window must be an odd number >= 3 (a centered window); got {window}")
    ds = LeRobotDataset(source)
    if ACTION_KEY not in ds.features:
        raise UserError(f"{source} has no {ACTION_KEY!r} feature")
    if ds.camera_keys:
        raise UserError(f"{source} has cameras {ds.camera_keys}; this script copies numeric datasets only")
    action_ft = ds.features[ACTION_KEY]
    dims = smoothed_dims(action_ft.get("names"), action_ft["shape"][0], keep)
    features = {k: ft for k, ft in ds.features.items() if k not in DEFAULT_FEATURES}
    extra_columns = [c for c in ds.episodes if c not in EPISODE_COLUMNS and "/" not in c]
    with LeRobotDatasetWriter(out, ds.fps, features, ds.info.get("robot_type")) as writer:
        for episode in range(ds.num_episodes):
            frames = ds.episode(episode)
            actions = np.array(frames[ACTION_KEY], dtype=np.float64)
            actions[:, dims] = centered_moving_average(actions[:, dims], window)
            data = {k: frames[k] for k in features}
            data[ACTION_KEY] = actions.astype(np.float32)
            info = {c: ds.episodes[c][episode] for c in extra_columns}
            writer.add_episode(data, frames["task"], info)
    return ds.num_episodes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", help="a LeRobot v3 dataset folder (numeric features only)")
    parser.add_argument("--out", required=True, help="the new dataset's folder (must not exist or be empty)")
    parser.add_argument("--window", type=int, default=3, help="frames in the centered window (odd, >= 3)")
    parser.add_argument(
        "--keep", nargs="*", default=["gripper"], help="action dims (by name) left unsmoothed"
    )
    args = parser.parse_args(argv)
    try:
        episodes = smooth_dataset(args.source, args.out, args.window, args.keep)
    except UserError as error:
        sys.exit(f"error: {error}")
    print(f"wrote {episodes} episodes to {args.out} (actions averaged over {args.window} frames)")


if __name__ == "__main__":
    main()
