"""The point of the pretrained towers, small enough for CI: after the same SFT on the same image demos of
`pick`, the flow VLA on ImageNet features tracks unseen demos more closely than the same VLA whose
vision tower starts from scratch (whose patch tokens, trained on few frames, do not learn where the cube
is; docs/results.md, "The nano VLAs on image pick: a diagnosis")."""

import dataclasses

import pytest

from embodrl.config import compose, make_run_dir
from embodrl.data.lerobot_dataset import LeRobotDataset
from embodrl.sims.registry import make_env
from embodrl.train.collect import CollectConfig, collect_demos
from embodrl.train.demo_replay import replay_demos, replayable_episodes
from embodrl.train.sft_runner import SFTRunner

TOWERS = {
    "scratch": ["policy.vision.tower=scratch"],
    "pretrained": ["policy.vision.tower=efficientnet-lite0", "policy.vision.blocks=8"],
}


def _unseen_error(tmp_path, train_dir, unseen_dir, tower: list[str]) -> float:
    cfg = compose(
        "pick_image_flow_vla",
        [
            f"run_root={tmp_path / 'runs'}",
            f"sft.dataset={train_dir}",
            "policy.train_expert_only=false",
            "sft.steps=400",
            "sft.eval_every=0",
            "sft.eval_episodes=1",
            "sft.videos=0",
            "sft.keep_best=false",
            "sft.save_every=1000",
            "train.tensorboard=false",
            "env.num_envs=6",
            *tower,
        ],
    )
    runner = SFTRunner(cfg, make_run_dir(cfg))
    runner.learn()
    dataset = LeRobotDataset(unseen_dir)
    with make_env(cfg.env) as env:
        report = replay_demos(runner.policy, env, dataset, replayable_episodes(dataset, "pick"))
    return report.error_on_env_obs


@pytest.mark.slow
def test_a_vla_on_a_pretrained_tower_tracks_unseen_demos_better_than_from_scratch(tmp_path):
    env_cfg = dataclasses.replace(compose("pick_image_flow_vla").env, num_envs=6)
    collect_demos(env_cfg, tmp_path / "train", CollectConfig(episodes_per_task=12), progress=False)
    unseen = CollectConfig(episodes_per_task=6, first_state_id=60000)
    collect_demos(env_cfg, tmp_path / "unseen", unseen, progress=False)
    errors = {
        name: _unseen_error(tmp_path / name, tmp_path / "train", tmp_path / "unseen", tower)
        for name, tower in TOWERS.items()
    }
    print(f"mean |action - demo action| on unseen demos: {errors}")
    assert errors["pretrained"] < 0.9 * errors["scratch"], errors  # measured: 0.157 against 0.191
