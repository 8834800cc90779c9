"""Training-time randomization (env.randomize.*) reaches every env a command builds: the demos of
`embodrl collect`, the evaluation env of `embodrl sft` and the rollout env of `embodrl train`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embodrl.config import compose, make_run_dir
from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.sims.registry import make_env
from embodrl.train.collect import CollectConfig, collect_demos
from embodrl.train.rl_runner import OnPolicyRunner
from embodrl.train.sft_runner import SFTRunner

BASE = ["env.task=reach", "env.num_envs=2", "env.max_episode_steps=20", "policy.obs_keys=[state]"]
NOISE = "env.randomize.proprio_noise=3"
STATES = torch.tensor([3, 4])


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    root = tmp_path_factory.mktemp("randomize")
    out = {}
    for name, extra in (("nominal", []), ("noisy", [NOISE])):
        out[name] = root / name
        collect_demos(
            compose(None, [*BASE, *extra]).env, out[name], CollectConfig(episodes_per_task=2), progress=False
        )
    return out


def test_collect_records_the_randomized_observations_and_the_experts_same_actions(demos):
    nominal, noisy = (LeRobotDataset(demos[name]) for name in ("nominal", "noisy"))
    assert nominal.num_episodes == noisy.num_episodes == 2
    for e in range(2):
        plain, perturbed = nominal.episode(e), noisy.episode(e)
        assert np.array_equal(
            np.asarray(plain["action"]), np.asarray(perturbed["action"])
        )  # from the true state
        noise = np.asarray(perturbed["observation.state"]) - np.asarray(plain["observation.state"])
        assert 0.005 < noise.std() < 0.03  # std 0.005 per unit of severity


def _first_states(env) -> torch.Tensor:
    return env.reset_to(STATES)["state"]


def test_the_sft_evaluation_env_and_the_rl_rollout_env_are_randomized(tmp_path, demos):
    with make_env(compose(None, BASE).env) as env:
        nominal = _first_states(env)
    sft = compose(
        None, [*BASE, NOISE, f"sft.dataset={demos['nominal']}", f"run_root={tmp_path}", "sft.steps=1"]
    )
    runner = SFTRunner(sft, make_run_dir(sft))
    assert not torch.allclose(_first_states(runner.env), nominal, atol=1e-3)
    runner.env.close()
    rl = compose(
        None, [*BASE, NOISE, f"run_root={tmp_path}", "train.iterations=1", "train.tensorboard=false"]
    )
    runner = OnPolicyRunner(rl, make_run_dir(rl))
    try:
        assert not torch.allclose(_first_states(runner.env), nominal, atol=1e-3)
    finally:
        runner.env.close()
