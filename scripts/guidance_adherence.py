"""How closely a flow policy's guided chunk follows the previous chunk (guided real-time chunking), offline.

For demo observations (every --stride-th frame of a dataset), a first chunk A is drawn from one noise seed;
the chunk that would follow it, s = N - d steps later, is drawn from another seed, once unguided and once
guided toward A's unexecuted actions (A[s:], overlap H - s, delay d) at each --max-weight. Printed per
chunk index i: the mean L2 distance (arm dims, the last action dim left out) between the new chunk's action
i and A's action for that step. Indices below d are executed from A while the new chunk is computed; index
d is the first executed from the new chunk, so its distance is the seam the guidance has to close. The
observation is the same for both chunks here (on the robot it moves on by s steps), so this isolates
what the sampler does from how the scene changed.

    python scripts/guidance_adherence.py RUN/checkpoints/last/policy --dataset data/rtc_pick_demos \\
        --key-map state=observation.environment_state --execute-steps 8 --delay 2
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch
from tensordict import TensorDict

from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.errors import UserError
from embodrl.policies.base import ChunkGuidance
from embodrl.policies.loading import load_policy


def parse_key_map(items: list[str]) -> dict[str, str]:
    """POLICY_KEY=DATASET_COLUMN items as a dict (UserError for an item without '=')."""
    bad = [item for item in items if "=" not in item]
    if bad:
        raise UserError(f"--key-map items must read POLICY_KEY=DATASET_COLUMN; got {bad}")
    return dict(item.split("=", 1) for item in items)


def observations(dataset: str, key_map: dict[str, str], keys: tuple[str, ...], stride: int) -> TensorDict:
    """Every `stride`-th frame's policy observation keys, read from the dataset columns they map to."""
    ds = LeRobotDataset(dataset)
    columns = {key: key_map.get(key, key) for key in keys}
    missing = [name for name in columns.values() if name not in ds.features]
    if missing:
        raise UserError(f"{dataset} lacks {missing}; map the policy's keys with --key-map KEY=COLUMN")
    tensors = {
        key: torch.tensor(np.asarray(ds.column(name))[::stride], dtype=torch.float32)
        for key, name in columns.items()
    }
    return TensorDict(tensors, batch_size=[len(next(iter(tensors.values())))])


def adherence(policy, obs: TensorDict, execute_steps: int, delay: int, max_weight: float) -> np.ndarray:
    """Mean arm-dim distance per chunk index to the previous chunk's action for that step [overlap];
    max_weight = 0 samples unguided (the same draw as `act`)."""
    horizon = policy.cfg.chunk_size
    shift = execute_steps - delay
    overlap = horizon - shift
    torch.manual_seed(0)
    first = policy.act(obs, deterministic=True).actions
    prev = torch.zeros_like(first)
    prev[:, :overlap] = first[:, shift:]
    n = first.shape[0]
    guidance = ChunkGuidance(prev, torch.full((n,), overlap), torch.full((n,), delay), max_weight)
    torch.manual_seed(1)
    new = policy.act_guided(obs, guidance)
    return (new[:, :overlap, :-1] - prev[:, :overlap, :-1]).norm(dim=-1).mean(0).numpy()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "checkpoint", help="a flow policy's checkpoint folder (one that can guide its chunks)"
    )
    parser.add_argument("--dataset", required=True, help="a LeRobot dataset whose frames give observations")
    parser.add_argument(
        "--key-map", nargs="*", default=[], help="POLICY_KEY=DATASET_COLUMN for keys named differently"
    )
    parser.add_argument("--stride", type=int, default=10, help="use every stride-th frame")
    parser.add_argument("--execute-steps", type=int, default=8, help="N: actions executed per chunk")
    parser.add_argument(
        "--delay", type=int, default=2, help="d: steps executed while the next chunk computes"
    )
    parser.add_argument("--max-weight", type=float, nargs="+", default=[5.0], help="guidance weight caps")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        key_map = parse_key_map(args.key_map)
        policy = load_policy(args.checkpoint).eval()
        if not policy.can_guide_chunks:
            raise UserError(f"a {policy.family} policy cannot guide its chunks")
        if not 0 < args.delay < args.execute_steps <= policy.cfg.chunk_size:
            raise UserError(
                f"need 0 < --delay < --execute-steps <= chunk size {policy.cfg.chunk_size}; "
                f"got {args.delay}, {args.execute_steps}"
            )
        obs = observations(args.dataset, key_map, tuple(policy.cfg.obs_keys), args.stride)
    except UserError as error:
        sys.exit(f"error: {error}")
    seam = f"index {args.delay}: the seam"
    print(f"{obs.batch_size[0]} observations; distance to the previous chunk's action per index ({seam})")
    for weight in (0.0, *args.max_weight):
        distances = adherence(policy, obs, args.execute_steps, args.delay, weight)
        label = "unguided" if weight == 0 else f"max weight {weight:g}"
        print(f"{label:>16}: " + " ".join(f"{i}:{value:.2f}" for i, value in enumerate(distances)))


if __name__ == "__main__":
    main()
