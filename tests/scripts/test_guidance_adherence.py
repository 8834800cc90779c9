"""scripts/guidance_adherence.py: how closely a guided chunk follows the previous chunk, offline."""

import runpy
from pathlib import Path

import numpy as np
import pytest
import torch

from embodrl.errors import UserError
from embodrl.policies.config import PolicyConfig
from embodrl.policies.registry import make_policy

SCRIPT = Path(__file__).parents[2] / "scripts" / "guidance_adherence.py"
script = runpy.run_path(str(SCRIPT))


def test_guidance_brings_the_chunk_to_the_previous_one_where_it_is_weighted():
    torch.manual_seed(0)
    cfg = PolicyConfig(family="flow", chunk_size=8, action_dim=3, obs_keys=("state",))
    policy = make_policy(cfg, {"state": (4,)}).eval()
    obs = script["TensorDict"]({"state": torch.randn(16, 4)}, batch_size=[16])
    unguided = script["adherence"](policy, obs, execute_steps=4, delay=2, max_weight=0.0)
    guided = script["adherence"](policy, obs, execute_steps=4, delay=2, max_weight=5.0)
    assert unguided.shape == guided.shape == (6,)  # overlap H - (N - d) = 8 - 2
    assert np.all(guided[:2] < 0.5 * unguided[:2])  # the d frozen steps, weighted fully
    assert guided[-1] == pytest.approx(unguided[-1], rel=0.2)  # the mask's last step: weight near 0


def test_a_key_map_item_without_equals_is_refused():
    assert script["parse_key_map"](["state=observation.environment_state"]) == {
        "state": "observation.environment_state"
    }
    with pytest.raises(UserError, match="POLICY_KEY=DATASET_COLUMN"):
        script["parse_key_map"](["state"])
