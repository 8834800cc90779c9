"""What the learner makes of the raw observations actors send: the reward model's reward (never the actor's
own, nor the simulator's success flag), and cameras stored as the policy's frozen features, as `embodrl
train` stores them; the keys only the reward model reads reach it from a robot too."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from embodrl.cli import main
from embodrl.config import compose
from embodrl.deploy.config import RobotConfig
from embodrl.remote.actor import run_actor
from embodrl.remote.robot_actor import run_robot_actor
from embodrl.remote.robot_config import RobotActorConfig
from embodrl.train import learned_reward_env
from tests.remote.tiny import TABLETOP_SAC, connection, serving_learner

torch.set_num_threads(1)
HIGH = 0.35  # the stand-in classifier's success: the end effector above this height


class HighIsSuccess:
    """A stand-in success classifier: done when the end effector is above HIGH (it also reads the camera,
    when the env has one, to need a key the policy does not read)."""

    def __init__(self, obs_keys: tuple[str, ...]) -> None:
        shapes = {"state": (17,), "rgb": (64, 64, 3)}
        self.spec = SimpleNamespace(obs_keys=obs_keys, shapes={k: shapes[k] for k in obs_keys}, threshold=0.5)

    def probability(self, obs: TensorDict) -> torch.Tensor:
        assert all(key in obs.keys() for key in self.spec.obs_keys)
        return (obs["state"][:, 2] > HIGH).float()


def fake_classifier(monkeypatch, obs_keys: tuple[str, ...]) -> None:
    monkeypatch.setattr(learned_reward_env, "load_classifier", lambda path, device: HighIsSuccess(obs_keys))


def test_the_reward_is_the_models_on_what_the_actor_sent(monkeypatch, tmp_path):
    fake_classifier(monkeypatch, ("state",))
    experiment = [*TABLETOP_SAC, "reward.model=fake", "reward.terminate_on_success=true"]
    with serving_learner(experiment, tmp_path) as learner:
        url = f"ws://127.0.0.1:{learner.server.port}"
        assert (
            main(["actor", *experiment, "--learner", url, "--transitions", "40", "--batch-steps", "5"]) == 0
        )
        arrivals = learner.intake.take()
        for arrival in arrivals:
            learner._take(arrival)
        metrics = learner.judge.pop_metrics()
    rows = learner.buffer.data[: len(learner.buffer)]
    assert len(rows) == 40
    high = rows["next_obs"]["state"][:, 2] > HIGH
    assert torch.equal(rows["reward"], high.float()) and torch.equal(rows["terminated"], high)
    assert 0 < high.sum() < 40  # both labels occur; the actor's own reward (reach's sparse) is not used
    sent = np.concatenate([a.transitions["reward"] for a in arrivals])
    assert not np.array_equal(sent, rows["reward"].numpy())
    assert metrics["reward/predicted_success"] == pytest.approx(high.float().mean().item())


def test_cameras_arrive_raw_and_are_stored_as_frozen_features(tmp_path):
    experiment = [
        "policy=gaussian_sac",
        "env=tabletop_basic",
        "algo=sac",
        "env.task=reach",
        "env.num_envs=1",
        "env.obs_mode=rgb",
        "policy.action_dim=7",
        "policy.obs_keys=[rgb,state]",
        "policy.vision.tower=efficientnet-lite0",
        "policy.vision.blocks=2",
        "policy.gaussian.hidden_dims=[16]",
        "algo.critic_hidden_dims=[16]",
        "algo.critic_image_dim=8",
        "algo.buffer_size=100",  # allocated whole at the first transition: 100 of these feature maps
        "algo.num_critics=2",
        "train.tensorboard=false",
        "train.keep_best=false",
        "train.eval_every=0",
    ]
    cfg = compose(None, experiment)
    with serving_learner(experiment, tmp_path) as learner:
        run_actor(cfg.env, connection(learner), batch_steps=4, decisions=8)
        arrivals = learner.intake.take()
        for arrival in arrivals:
            learner._take(arrival)
    raw = torch.from_numpy(np.concatenate([a.transitions["next_obs"]["rgb"] for a in arrivals]))
    assert raw.shape == (8, 64, 64, 3) and raw.dtype == torch.uint8
    stored = learner.buffer.data[: len(learner.buffer)]["next_obs"]["rgb"]
    features = learner.policy.frozen_features(TensorDict({"rgb": raw}, batch_size=[8]))["rgb"]
    assert stored.shape == features.shape != raw.shape and torch.allclose(stored, features)


def test_a_robot_sends_the_camera_that_only_the_reward_model_reads(monkeypatch, tmp_path):
    fake_classifier(monkeypatch, ("rgb", "state"))
    experiment = [*TABLETOP_SAC, "env.obs_mode=rgb", "reward.model=fake"]
    with serving_learner(experiment, tmp_path) as learner:
        assert learner.policy_spec()["read_keys"] == ["state", "rgb"]
        cfg = RobotActorConfig(
            fps=100.0, max_steps=10, episodes=1, robot=RobotConfig(kind="sim", task="reach", camera="rgb")
        )
        actor, _ = run_robot_actor(cfg, connection(learner, drop_when_full=True), batch_steps=5)
        arrivals = learner.intake.take()
        for arrival in arrivals:
            learner._take(arrival)
    assert actor.stats.decisions == 10
    assert all(a.transitions["obs"]["rgb"].shape[1:] == (64, 64, 3) for a in arrivals)
    rows = learner.buffer.data[: len(learner.buffer)]
    assert set(rows["obs"].keys()) == {"state"}  # the policy's keys: the camera only fed the reward model
    assert torch.equal(rows["reward"], (rows["next_obs"]["state"][:, 2] > HIGH).float())


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
