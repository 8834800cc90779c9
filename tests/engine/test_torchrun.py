"""`embodrl train` in torchrun's environment: 2 gloo ranks with their own rollouts, one run folder, resume."""

import os
import socket

import torch
import torch.multiprocessing as mp

from embodrl import cli
from embodrl.train.logger import read_metrics
from embodrl.train.rl_runner import OnPolicyRunner
from tests.pendulum import PENDULUM

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, port, argv, results):
    """One torchrun rank: its environment variables, then the command line; keeps what the test checks."""
    ids = {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": WORLD, "MASTER_PORT": port}
    os.environ.update({"MASTER_ADDR": "127.0.0.1", **{k: str(v) for k, v in ids.items()}})
    learn = OnPolicyRunner.learn

    def learn_and_keep(runner):
        final = learn(runner)
        kept = {"weights": runner.policy.state_dict(), "obs": runner.buffer.data["obs", "state"].clone()}
        torch.save({**kept, "iteration": runner.iteration, "final": final}, f"{results}/rank{rank}.pt")
        return final

    OnPolicyRunner.learn = learn_and_keep
    if cli.main(argv) != 0:
        raise RuntimeError(f"rank {rank}: embodrl train failed")


def _torchrun(tmp_path, argv):
    mp.spawn(_rank_main, args=(_free_port(), argv, tmp_path), nprocs=WORLD)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def test_two_ranks_train_their_own_rollouts_into_one_run_folder_and_resume(tmp_path):
    runs = tmp_path / "runs"
    overrides = [*PENDULUM, f"run_root={runs}", "name=dp", "train.save_every=1"]
    ranks = _torchrun(tmp_path, ["train", *overrides, "train.iterations=2"])
    (run_dir,) = (runs / "dp").iterdir()  # rank 0 alone made it
    assert [r["iteration"] for r in read_metrics(run_dir)] == [1, 2]
    assert (run_dir / "checkpoints/last/policy/config.json").is_file()
    assert (run_dir / "final_eval.json").is_file()
    assert not torch.equal(ranks[0]["obs"], ranks[1]["obs"]), "the ranks collected the same rollout"
    for name, value in ranks[0]["weights"].items():
        assert torch.equal(ranks[1]["weights"][name], value), name
    assert ranks[0]["final"] == ranks[1]["final"], "rank 0's final evaluation is every rank's result"

    ranks = _torchrun(tmp_path, ["train", "--resume", str(run_dir), "train.iterations=3"])
    assert [r["iteration"] for r in read_metrics(run_dir)] == [1, 2, 3]
    assert ranks[0]["iteration"] == ranks[1]["iteration"] == 3
    assert not torch.equal(ranks[0]["obs"], ranks[1]["obs"]), "resumed ranks replay the same rollout"
    for name, value in ranks[0]["weights"].items():
        assert torch.equal(ranks[1]["weights"][name], value), name
