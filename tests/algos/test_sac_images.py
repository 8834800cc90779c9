"""SAC on a camera: the frozen tower's features stand in for the images in stored batches, the critic
projects them, an update trains the actor's and the critic's heads and leaves the tower as it was."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from embodrl.algos.config import AlgoConfig
from embodrl.algos.sac import SAC
from embodrl.policies.config import PolicyConfig
from embodrl.policies.gaussian.configuration import GaussianConfig
from embodrl.policies.registry import make_policy
from embodrl.policies.vision_config import VisionConfig

SHAPES = {"state": (3,), "rgb": (32, 32, 3)}
BATCH = 4


def image_sac() -> SAC:
    torch.manual_seed(0)
    cfg = PolicyConfig(
        family="gaussian",
        chunk_size=1,
        action_dim=2,
        obs_keys=("rgb", "state"),
        obs_clip=0.0,
        action_normalization="identity",
        gaussian=GaussianConfig(hidden_dims=(16,), squash="tanh"),
        vision=VisionConfig(tower="efficientnet-lite0", blocks=2),
    )
    algo = AlgoConfig(
        name="sac", num_critics=3, critic_hidden_dims=(8,), critic_image_dim=8, batch_size=BATCH
    )
    return SAC(make_policy(cfg, SHAPES), algo)


def observations(seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "state": torch.randn(BATCH, 3, generator=g),
            "rgb": torch.randint(0, 256, (BATCH, 32, 32, 3), generator=g, dtype=torch.uint8),
        },
        batch_size=[BATCH],
    )


def test_stored_observations_hold_the_frozen_features_that_the_update_reads():
    algo = image_sac()
    obs = observations(0)
    stored = algo.stored_obs(obs)
    features = stored["rgb"]
    assert features.dtype == torch.float32 and features.dim() == 4  # [B, C, h, w]: no pixels kept
    torch.testing.assert_close(features, algo.policy.frozen_features(obs)["rgb"])
    torch.testing.assert_close(stored["state"], obs["state"])
    # the actor reads the cached features as it reads the pixels
    torch.manual_seed(1)
    cached, _ = algo.sample_actions(stored)
    torch.manual_seed(1)
    direct, _ = algo.policy.sample_reparameterized(obs)
    torch.testing.assert_close(cached, direct)

    batch = TensorDict(
        {
            "obs": stored,
            "action": torch.zeros(BATCH, 1, 2),
            "reward": torch.ones(BATCH),
            "next_obs": algo.stored_obs(observations(1)),
            "terminated": torch.zeros(BATCH, dtype=torch.bool),
        },
        batch_size=[BATCH],
    )
    tower = [b.clone() for b in algo.policy.encoder.images.buffers()]
    heads = [p.detach().clone() for p in algo.policy.encoder.image_heads.parameters()]
    projection = [p.detach().clone() for p in algo.critic.cameras.parameters()]
    metrics = algo.update(lambda: batch, torch.Generator().manual_seed(0))
    assert {"critic_loss", "actor_loss", "temperature"} <= metrics.keys()
    assert all(torch.equal(a, b) for a, b in zip(tower, algo.policy.encoder.images.buffers(), strict=True))
    assert any(
        not torch.equal(a, b)
        for a, b in zip(heads, algo.policy.encoder.image_heads.parameters(), strict=True)
    )
    moved = zip(projection, algo.critic.cameras.parameters(), strict=True)
    assert any(not torch.equal(a, b) for a, b in moved)
