"""Noise-space RL (algo.noise_policy, DSRL) on Pendulum-v1 with a small flow policy as the steered one: the
wrapper executes that policy's chunk for the (clipped) noise, a run saves, resumes exactly and evaluates
through the policy its checkpoint names, and bad settings are one-line errors."""

from __future__ import annotations

import pytest
import torch

from embodrl.cli import main
from embodrl.config import compose
from embodrl.deploy.export import export_policy
from embodrl.deploy.runner import CheckpointRunner
from embodrl.errors import ConfigError, UserError
from embodrl.policies.config import PolicyConfig
from embodrl.policies.flow.configuration import FlowConfig
from embodrl.policies.loading import load_policy
from embodrl.policies.registry import make_policy
from embodrl.sims.registry import make_env
from embodrl.sims.wrapped import WrappedEnv
from embodrl.train.checkpointing import LAST, POLICY_DIR, load_trainer_state
from embodrl.train.logger import read_metrics
from embodrl.train.noise_action_env import NoiseActionEnv, env_for
from embodrl.train.offpolicy_runner import OffPolicyRunner
from embodrl.train.play import action_source
from tests.train.test_offpolicy_runner import SWING_UP, TINY, comparable

BOUND = 1.2


def save_flow_policy(directory, family: str = "flow"):
    """A small untrained policy on Pendulum's state (chunk 2 of 1-D torques), saved to `directory`."""
    torch.manual_seed(0)
    cfg = PolicyConfig(family=family, chunk_size=2, action_dim=1, flow=FlowConfig(hidden_dims=(16,)))
    policy = make_policy(cfg, {"state": (3,)})
    policy.set_normalization({"action": {"mean": [0.5], "std": [0.8]}, "state": {"mean": [0.1, 0.2, 0.3]}})
    policy.save_pretrained(directory)
    return directory


def dsrl(base, iterations: int, *extra: str):
    overrides = [
        *TINY,
        f"train.iterations={iterations}",
        f"algo.noise_policy={base}",
        f"algo.noise_bound={BOUND}",
    ]
    return compose("sac_pendulum", [*overrides, *extra])


class Recording(WrappedEnv):
    """Keeps the action chunks it is stepped with."""

    def __init__(self, env) -> None:
        super().__init__(env)
        self.executed: list[torch.Tensor] = []

    def step(self, actions):
        self.executed.append(actions.clone())
        return super().step(actions)


def test_a_step_executes_the_steered_policys_chunk_for_the_clipped_noise(tmp_path):
    base = load_policy(save_flow_policy(tmp_path / "base"))
    inner = Recording(make_env(compose("sac_pendulum").env))
    env = NoiseActionEnv(inner, base, BOUND)
    assert env.action_spec.dim == 1 and (env.action_spec.low, env.action_spec.high) == (-BOUND, BOUND)
    obs = env.reset_to(torch.tensor([0]))
    noise = torch.tensor([[[2.0], [-0.3]]])  # the first beyond the bound
    result = env.step(noise)
    expected = base.act_from_noise(obs, torch.tensor([[[BOUND], [-0.3]]]))
    assert torch.equal(inner.executed[0], expected) and result.reward.shape == (1, 2)
    assert torch.equal(env.obs["state"], result.obs["state"])  # the next noise is decoded on this
    assert not any(p.requires_grad for p in base.parameters()) and not base.training
    with pytest.raises(UserError, match=r"shape \[N, 2, 1\]"):
        env.step(torch.zeros(1, 3, 1))


@pytest.mark.parametrize("algo", ["sac", "dsrl_na"])
def test_a_dsrl_run_resumes_exactly_and_evaluates_through_the_policy_it_steers(tmp_path, algo):
    base = save_flow_policy(tmp_path / "base")
    before = {k: v.clone() for k, v in load_policy(base).state_dict().items()}
    whole, split = tmp_path / "whole", tmp_path / "split"
    whole.mkdir(), split.mkdir()
    name = f"algo.name={algo}"
    runner = OffPolicyRunner(dsrl(base, 3, name), whole)
    runner.learn()
    OffPolicyRunner(dsrl(base, 2, name), split).learn()
    OffPolicyRunner(dsrl(base, 3, name), split, resume=True).learn()
    assert comparable(split) == comparable(whole) and "eval/return" in comparable(whole)[1]
    replay = load_trainer_state(whole / LAST)["replay"]["data"]["action"]
    assert replay.shape == (15, 2, 1) and replay.abs().max() <= BOUND + 1e-5  # the noise, within its bound
    assert all(torch.equal(v, before[k]) for k, v in runner.env.base.state_dict().items())  # frozen
    saved = load_policy(whole / LAST / POLICY_DIR)
    assert saved.cfg.steers == str(base.resolve()) and saved.chunk_shape == (2, 1)
    assert saved.normalizers["state"].mean.tolist() == pytest.approx([0.1, 0.2, 0.3])  # the steered policy's
    assert saved.normalizers["action"].unnormalize(torch.ones(1)).item() == pytest.approx(BOUND)
    out = tmp_path / "eval"
    args = [
        "eval",
        str(whole / LAST / POLICY_DIR),
        "--episodes",
        "1",
        "--record",
        "0",
        "--out",
        str(out),
        "env=pendulum",
    ]
    assert main(args) == 0 and (out / "summary.json").is_file()
    assert isinstance(env_for(saved, make_env(compose("sac_pendulum").env)), NoiseActionEnv)


def test_play_decodes_a_noise_space_actor_and_serve_and_export_refuse_it(tmp_path):
    base = save_flow_policy(tmp_path / "base")
    (tmp_path / "run").mkdir()
    OffPolicyRunner(dsrl(base, 1, "train.eval_every=0", "train.keep_best=false"), tmp_path / "run").learn()
    actor = tmp_path / "run" / LAST / POLICY_DIR
    env = make_env(compose("sac_pendulum").env)
    obs = env.reset_to(torch.tensor([2]))
    noise = load_policy(actor).act(obs, deterministic=True).actions
    played = action_source(str(actor), env, seed=0)(obs)
    assert torch.equal(played, load_policy(base).act_from_noise(obs, noise))
    for call in (
        lambda: CheckpointRunner(actor),
        lambda: export_policy(load_policy(actor), tmp_path, "onnx"),
    ):
        with pytest.raises(UserError, match="initial noise of") as error:
            call()
        assert "\n" not in str(error.value)


def test_bad_noise_space_settings_are_one_line_errors(tmp_path):
    base = save_flow_policy(tmp_path / "base")
    cases = [
        (ConfigError, "set algo=sac", lambda: dsrl(base, 1, "algo=ppo")),
        (
            UserError,
            "flow policy",
            lambda: OffPolicyRunner(dsrl(save_flow_policy(tmp_path / "g", "gaussian"), 1), tmp_path),
        ),
        (
            UserError,
            "acts in 1 dims",
            lambda: OffPolicyRunner(dsrl(base, 1, "env.gym_id=MountainCarContinuous-v0"), tmp_path),
        ),
        (UserError, "is not a policy checkpoint", lambda: OffPolicyRunner(dsrl(tmp_path, 1), tmp_path)),
    ]
    for kind, message, call in cases:
        with pytest.raises(kind, match=message) as error:
            call()
        assert "\n" not in str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "dsrl_na"])
def test_dsrl_learns_to_swing_the_pendulum_up_through_an_untrained_flow_policy(tmp_path, algo):
    """The steered policy's untrained ODE bends its noise into torques (x0 times 1.5 plus a small field):
    SAC in that noise space (and DSRL-NA, its critic on the torques), 5000 env steps as the plain SAC test,
    ends far above the random episodes."""
    torch.manual_seed(0)
    cfg = PolicyConfig(family="flow", chunk_size=1, action_dim=1, flow=FlowConfig(hidden_dims=(16,)))
    base = make_policy(cfg, {"state": (3,)})
    base.set_normalization({"action": {"mean": [0.0], "std": [1.5]}})
    base.save_pretrained(tmp_path / "base")
    overrides = [f"algo.noise_policy={tmp_path / 'base'}", f"algo.name={algo}", *SWING_UP]
    (tmp_path / "run").mkdir()
    final = OffPolicyRunner(compose("sac_pendulum", overrides), tmp_path / "run").learn()
    random = [row["rollout/return"] for row in read_metrics(tmp_path / "run")[:3]]
    assert final["eval/return"] > sum(random) / 3 + 400
