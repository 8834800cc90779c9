"""Registry: families by name, env observation specs as input, checkpoint loading by family."""

import pytest
import torch

from embodrl.errors import UserError
from embodrl.policies.config import PolicyConfig
from embodrl.policies.flow.modeling import FlowPolicy
from embodrl.policies.gaussian.modeling import GaussianPolicy
from embodrl.policies.loading import load_policy
from embodrl.policies.registry import make_policy, policy_class
from embodrl.sims.base import TensorSpec


def test_make_policy_accepts_an_env_observation_spec_and_builds_the_named_family():
    spec = {"state": TensorSpec((9,), torch.float32), "rgb": TensorSpec((64, 64, 3), torch.uint8)}
    policy = make_policy(PolicyConfig(family="gaussian", action_dim=4), spec)
    assert isinstance(policy, GaussianPolicy) and policy.obs_shapes["state"] == (9,)
    assert isinstance(make_policy(PolicyConfig(family="flow"), {"state": (9,)}), FlowPolicy)


def test_unknown_family_lists_the_valid_ones():
    with pytest.raises(UserError, match="valid families: gaussian, flow"):
        policy_class("transformer")


def test_load_policy_dispatches_on_the_saved_family(tmp_path):
    make_policy(PolicyConfig(family="flow", action_dim=2), {"state": (3,)}).save_pretrained(tmp_path / "flow")
    assert isinstance(load_policy(tmp_path / "flow"), FlowPolicy)
    with pytest.raises(UserError, match="not a policy checkpoint"):
        load_policy(tmp_path)


def test_a_run_folder_passed_as_a_checkpoint_names_the_policies_inside(tmp_path):
    policy = make_policy(PolicyConfig(family="gaussian", action_dim=2), {"state": (3,)})
    for name in ("last", "best"):
        policy.save_pretrained(tmp_path / "checkpoints" / name / "policy")
    best, last = (str(tmp_path / "checkpoints" / name / "policy") for name in ("best", "last"))
    for folder, hint in [
        (tmp_path, f"did you mean {best} or {last}?"),
        (tmp_path / "checkpoints", f"did you mean {best} or {last}?"),
        (tmp_path / "checkpoints" / "last", f"did you mean {last}?"),
        (tmp_path / "elsewhere", "config.json is missing"),
    ]:
        with pytest.raises(UserError) as error:
            load_policy(folder)
        assert str(error.value).endswith(hint), error.value
