"""Shared helpers for the VLA family tests: nano-preset observations and policies."""

import torch
from tensordict import TensorDict

from embodrl.policies.config import PolicyConfig
from embodrl.policies.normalization import compute_stats
from embodrl.policies.registry import make_policy

N, C, A, S, IMAGE = 5, 2, 3, 4, 64
SHAPES = {"rgb": (IMAGE, IMAGE, 3), "wrist_rgb": (IMAGE, IMAGE, 3), "state": (S,), "privileged": (6,)}
INSTRUCTIONS = ("pick up the red cube", "push the blue cube to the target", "stack the green cube")
VLA_KEYS = ("rgb", "wrist_rgb", "state")
LOGPROB_SHAPES = {"token": (N, C, A), "action": (N, C), "chunk": (N,)}


def make_obs(n: int = N, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    obs = TensorDict(
        {
            "rgb": torch.randint(0, 256, (n, IMAGE, IMAGE, 3), generator=g, dtype=torch.uint8),
            "wrist_rgb": torch.randint(0, 256, (n, IMAGE, IMAGE, 3), generator=g, dtype=torch.uint8),
            "state": torch.randn(n, S, generator=g) * 2 + 1,
            "privileged": torch.randn(n, 6, generator=g),
        },
        batch_size=[n],
    )
    obs["instruction"] = [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(n)]
    return obs


def build(family: str, obs_keys=VLA_KEYS, **overrides):
    """A nano policy of `family` with action stats set, built from a plain config dict."""
    torch.manual_seed(0)
    data = {
        "family": family,
        "chunk_size": C,
        "action_dim": A,
        "obs_keys": list(obs_keys),
        "action_normalization": "quantile",
        "vla": {"instructions": list(INSTRUCTIONS)},
        **overrides,
    }
    policy = make_policy(PolicyConfig.from_dict(data), SHAPES)
    g = torch.Generator().manual_seed(1)
    policy.set_normalization(
        {
            "state": compute_stats(torch.randn(200, S, generator=g) * 2 + 1),
            "action": compute_stats(torch.randn(200, A, generator=g) * 0.3),
        }
    )
    return policy
