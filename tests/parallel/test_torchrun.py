"""`embodrl train` in torchrun's environment: 2 gloo ranks with their own rollouts, one run folder, resume;
with ddp, and with fsdp on a VLA whose transformer blocks are sharded."""

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from embodrl import cli
from embodrl.parallel.data_parallel import transformer_blocks
from embodrl.policies.loading import load_policy
from embodrl.sims import registry
from embodrl.train.logger import read_metrics
from embodrl.train.rl_runner import OnPolicyRunner
from tests.engine import flaky_env
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
        # fsdp: every rank gathers each weight's shards (the same collectives in the same order)
        weights = {
            k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in runner.policy.state_dict().items()
        }
        sharded = sum(isinstance(b, FSDPModule) for b in transformer_blocks(runner.policy))
        kept = {
            "weights": weights,
            "sharded_blocks": sharded,
            "obs": runner.buffer.data["obs", "state"].clone(),
        }
        torch.save({**kept, "iteration": runner.iteration, "final": final}, f"{results}/rank{rank}.pt")
        return final

    OnPolicyRunner.learn = learn_and_keep
    if cli.main(argv) != 0:
        raise RuntimeError(f"rank {rank}: embodrl train failed")


def _flaky_rank_main(rank, port, argv, results):
    """A rank whose env raises at its 30th step (the 2nd rollout) on rank 0 only; the suite is registered
    here because every rank is a new process."""
    registry.SUITES["flaky"] = "tests.engine.flaky_env:make_flaky"
    flaky_env.FlakyVecEnv.fail_at = 30 if rank == 0 else -1
    _rank_main(rank, port, argv, results)


def _torchrun(tmp_path, argv, main=_rank_main):
    mp.spawn(main, args=(_free_port(), argv, tmp_path), nprocs=WORLD)
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


# The nano pi0 (SigLIP-style tower, Llama decoder, action expert: 10 blocks) with 2 decisions per rollout.
FLOW_VLA_NANO = [
    "pi0_flow_noise_nano",
    "env.num_envs=2",
    "env.max_episode_steps=10",
    "algo.num_epochs=1",
    "algo.minibatch_size=4",
    "train.eval_every=1",
    "train.eval_episodes=1",
    "train.tensorboard=false",
    "engine.data_parallel=fsdp",
]


def _adam_steps(run_dir) -> set[float]:
    """Adam's step count of every parameter in the last checkpoint (one update per iteration here)."""
    state = torch.load(run_dir / "checkpoints/last/trainer_state.pt", weights_only=False)
    optimizer = state["algo"]["optimizer"]["state"]
    assert optimizer and all(isinstance(name, str) for name in optimizer)
    return {float(param["step"]) for param in optimizer.values()}


@pytest.mark.slow
def test_fsdp_ranks_shard_a_vla_save_a_whole_checkpoint_and_resume(tmp_path):
    runs = tmp_path / "runs"
    overrides = [*FLOW_VLA_NANO, f"run_root={runs}", "name=fsdp", "train.save_every=1"]
    ranks = _torchrun(tmp_path, ["train", *overrides, "train.iterations=2"])
    (run_dir,) = (runs / "fsdp").iterdir()
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all("eval/success" in r for r in rows), "rank 0 evaluated its unsharded copy"
    assert ranks[0]["sharded_blocks"] == ranks[1]["sharded_blocks"] == 10
    assert not torch.equal(ranks[0]["obs"], ranks[1]["obs"]), "the ranks collected the same rollout"
    assert ranks[0]["final"] == ranks[1]["final"]
    saved = load_policy(run_dir / "checkpoints/last/policy").state_dict()  # one process, no process group
    assert saved.keys() == ranks[0]["weights"].keys()
    assert _adam_steps(run_dir) == {2.0}, "the checkpoint holds the whole optimizer state, by parameter name"
    for name, value in ranks[0]["weights"].items():
        assert torch.equal(ranks[1]["weights"][name], value), name
        assert torch.equal(saved[name], value), name

    ranks = _torchrun(tmp_path, ["train", "--resume", str(run_dir), "train.iterations=3"])
    assert [r["iteration"] for r in read_metrics(run_dir)] == [1, 2, 3]
    assert ranks[0]["iteration"] == ranks[1]["iteration"] == 3
    changed = False
    for name, value in ranks[0]["weights"].items():
        assert torch.equal(ranks[1]["weights"][name], value), name
        changed |= not torch.equal(saved[name], value)
    assert changed, "the resumed iteration changed no weight"
    assert _adam_steps(run_dir) == {3.0}, "the resumed ranks did not load the optimizer state"


@pytest.mark.slow
def test_fsdp_ranks_retry_a_rollout_together_when_one_ranks_env_worker_fails(tmp_path):
    """Rank 0's env raises mid-rollout: it finishes the rollout's forwards on placeholders, both ranks
    retry it from the same states, and the run is the run without the failure."""
    runs = {}
    for name, suite, main in (("clean", "gym", _rank_main), ("flaky", "flaky", _flaky_rank_main)):
        runs[name] = tmp_path / name / "runs"
        overrides = [*PENDULUM, "engine.data_parallel=fsdp", f"env.suite={suite}", f"run_root={runs[name]}"]
        ranks = _torchrun(tmp_path / name, ["train", *overrides, "name=fsdp", "train.iterations=3"], main)
        runs[name] = (read_metrics(next((runs[name] / "fsdp").iterdir())), ranks)
    (clean, clean_ranks), (flaky, flaky_ranks) = runs["clean"], runs["flaky"]
    assert [r["engine/env_restarts"] for r in flaky] == [
        0.0,
        1.0,
        1.0,
    ]  # rank 0's one failure, in iteration 2
    for a, b in zip(clean, flaky, strict=True):
        for key in ("train/policy_loss", "rollout/return", "rollout/env_steps"):
            assert a[key] == b[key], key
    for name, value in clean_ranks[0]["weights"].items():
        assert torch.equal(flaky_ranks[0]["weights"][name], value), name
        assert torch.equal(flaky_ranks[1]["weights"][name], value), name
