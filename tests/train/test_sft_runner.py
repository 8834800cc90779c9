"""SFT runs resume exactly: after a kill, a crash inside a step or a second signal, the resumed run logs
the losses and ends with the weights of the uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from embodrl.config import compose, make_run_dir
from embodrl.data.shuffled_batches import ShuffledBatches
from embodrl.errors import UserError
from embodrl.train.collect import CollectConfig, collect_demos
from embodrl.train.logger import read_metrics
from embodrl.train.sft_runner import SFTRunner

BASE = ["env.task=reach", "env.num_envs=2", "env.max_episode_steps=20", "policy.obs_keys=[state]"]
# 60 steps log every 3 and save every 7: a resume point falls inside a logging window
SFT = [
    "sft.steps=60",
    "sft.save_every=7",
    "sft.batch_size=16",
    "sft.eval_episodes=1",
    "train.tensorboard=false",
]


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "demos"
    collect_demos(compose(None, BASE).env, out, CollectConfig(episodes_per_task=3), progress=False)
    return out


def _runner(tmp_path, demos, resume_dir=None) -> SFTRunner:
    if resume_dir is not None:
        return SFTRunner(compose(str(resume_dir / "config.yaml"), []), resume_dir, resume=True)
    cfg = compose(None, [*BASE, *SFT, f"sft.dataset={demos}", f"run_root={tmp_path}"])
    return SFTRunner(cfg, make_run_dir(cfg))


def test_shuffled_batches_depend_only_on_the_seed_and_the_step():
    straight = ShuffledBatches(10, 4, seed=3)
    batches = [b for _, b in zip(range(7), straight, strict=False)]
    assert all(len(b) == 4 for b in batches)
    assert sorted(batches[0] + batches[1]) != list(range(8))  # shuffled
    assert len(set(batches[0] + batches[1])) == 8  # an epoch draws each sample at most once
    assert batches[2] != batches[0]  # epoch 1 has its own order
    resumed = ShuffledBatches(10, 4, seed=3, first_step=5)
    assert [b for _, b in zip(range(2), resumed, strict=False)] == batches[5:7]
    assert [len(b) for _, b in zip(range(3), ShuffledBatches(10, 4, 3, drop_last=False), strict=False)] == [
        4,
        4,
        2,
    ]


@pytest.mark.parametrize("where", ["between steps", "inside a step"])
def test_a_resumed_sft_run_logs_and_ends_as_the_uninterrupted_one(tmp_path, demos, where):
    straight = _runner(tmp_path / "a", demos)
    straight.learn()
    expected = read_metrics(straight.run_dir)

    interrupted = _runner(tmp_path / "b", demos)
    if where == "between steps":  # e.g. the data loader fails: the step-16 state is whole and saved
        batches = interrupted.batches

        def failing_after_16_batches():
            for i, batch in enumerate(batches()):
                if i == 16:
                    raise RuntimeError("killed")
                yield batch

        interrupted.batches = failing_after_16_batches
    else:  # the optimizer stepped but the step did not end: nothing is saved over the step-14 checkpoint
        train_step = interrupted.train_step

        def killed_inside_step_17(batch):
            if interrupted.step == 16:
                train_step(batch)
                raise RuntimeError("killed")
            return train_step(batch)

        interrupted.train_step = killed_inside_step_17
    with pytest.raises(RuntimeError, match="killed"):
        interrupted.learn()
    resumed = _runner(tmp_path / "b", demos, resume_dir=interrupted.run_dir)
    assert resumed.step == (16 if where == "between steps" else 14)
    resumed.learn()
    got = read_metrics(interrupted.run_dir)
    assert [r["iteration"] for r in got] == [r["iteration"] for r in expected]  # no line twice
    assert [r["sft/loss"] for r in got] == [r["sft/loss"] for r in expected]
    for name, value in straight.policy.state_dict().items():
        assert torch.equal(resumed.policy.state_dict()[name], value), name


def test_sft_key_map_names_the_dataset_feature_that_feeds_an_input(tmp_path, demos):
    cfg = compose(
        None,
        [
            *BASE,
            *SFT,
            f"sft.dataset={demos}",
            f"run_root={tmp_path}",
            "sft.key_map={state: observation.joints}",
        ],
    )
    assert cfg.sft.key_map == {"state": "observation.joints"}
    with pytest.raises(UserError, match=r"lacks features \{'state': 'observation.joints'\}.*sft.key_map"):
        SFTRunner(cfg, make_run_dir(cfg))
