"""The actor/learner transport over localhost: acknowledged transitions/s and weight-pull latency.

Three measurements against the learner's server (embodrl/remote/learner_server.py) with its transition
log in a temporary folder (each batch fsync'd before its ack) and a thread standing in for the trainer
(it takes the stored batches as fast as they come; no updates run, so the numbers are the transport's):
1. transport: LearnerClient submits `--batches` batches of B Pendulum transitions (3-D state, 1-D action)
   as fast as it can; transitions/s = B x batches / time until the last is acknowledged.
2. sim actor: SimActor plays Pendulum-v1 with the gaussian_sac policy (256x256, weights published) and
   streams batches of `--batch-steps` decisions; transitions/s acknowledged, env and policy included.
3. weight pull: the time from a "pull" request to the unpacked state dict of that policy (a fresh
   version each time), median of `--pulls`; plus loading it into the actor's policy.

    python benchmarks/remote_throughput.py            # ~20 s on 2 cores
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from websockets.sync.client import connect

from embodrl.config import compose
from embodrl.remote.actor import SimActor
from embodrl.remote.arrays import to_arrays, to_tensors
from embodrl.remote.client import LearnerClient
from embodrl.remote.config import ActorConnectionConfig, LearnerServerConfig
from embodrl.remote.intake import Intake
from embodrl.remote.learner_server import LearnerServer
from embodrl.remote.protocol import packb, unpackb
from embodrl.remote.transition_log import TransitionLog
from embodrl.sims.registry import make_env
from embodrl.train.policy_setup import build_policy


def pendulum_batch(count: int) -> dict:
    state = np.random.default_rng(0).normal(size=(count, 3)).astype(np.float32)
    return {
        "obs": {"state": state},
        "action": np.zeros((count, 1, 1), np.float32),
        "reward": np.zeros(count, np.float32),
        "next_obs": {"state": state},
        "terminated": np.zeros(count, bool),
    }


class Trainer(threading.Thread):
    """Takes the stored batches as they come, counting transitions (the learner's side, minus updates)."""

    def __init__(self, intake: Intake) -> None:
        super().__init__(daemon=True)
        self.intake, self.transitions, self.stopping = intake, 0, threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.transitions += sum(len(a.transitions["reward"]) for a in self.intake.take(0.05))


def transport(server: LearnerServer, batch: int, batches: int, actor_id: str) -> float:
    cfg = ActorConnectionConfig(learner=f"ws://127.0.0.1:{server.port}", actor_id=actor_id)
    transitions = pendulum_batch(batch)
    with LearnerClient(cfg) as client:
        start = time.perf_counter()
        for _ in range(batches):
            client.submit(transitions, env_steps=batch)
        assert client.flush(120)
        return batch * batches / (time.perf_counter() - start)


def sim_actor(server: LearnerServer, env_cfg, batch_steps: int, decisions: int) -> float:
    cfg = ActorConnectionConfig(learner=f"ws://127.0.0.1:{server.port}", actor_id="sim", pull_every_s=0.05)
    with LearnerClient(cfg) as client, make_env(env_cfg) as env:
        actor = SimActor(env, client, batch_steps)
        while actor.stats.version == 0:  # act with the published policy, not uniformly at random
            actor._load_new_weights()
            time.sleep(0.01)
        start = time.perf_counter()
        actor.run(decisions, status_every_s=1e9)
        assert client.flush(120)
        return client.stats.acked_transitions / (time.perf_counter() - start)


def pull_latency(server: LearnerServer, policy: torch.nn.Module, pulls: int) -> tuple[float, float, int]:
    """(median ms from request to unpacked state, median ms to load it into a policy, message bytes)."""
    state = to_arrays(policy.state_dict())
    fetch, load = [], []
    with connect(f"ws://127.0.0.1:{server.port}", max_size=None) as ws:
        for version in range(1, pulls + 1):
            server.publish(version, state)
            start = time.perf_counter()
            ws.send(packb({"type": "pull", "learner": "", "version": 0}))
            frame = ws.recv(timeout=30)
            received = unpackb(frame)["state"]
            fetch.append(time.perf_counter() - start)
            start = time.perf_counter()
            policy.load_state_dict(to_tensors(received))
            load.append(time.perf_counter() - start)
    return 1000 * statistics.median(fetch), 1000 * statistics.median(load), len(frame)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=2000, help="batches per transport measurement")
    parser.add_argument("--batch-steps", type=int, default=8, help="the sim actor's decisions per batch")
    parser.add_argument("--decisions", type=int, default=20000, help="the sim actor's transitions")
    parser.add_argument("--pulls", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = compose("sac_pendulum", [])
    with make_env(cfg.env) as env:
        policy = build_policy(cfg, env)
    spec = {
        "family": policy.family,
        "policy": policy.cfg.to_dict(),
        "obs_shapes": {key: list(shape) for key, shape in policy.obs_shapes.items()},
        "read_keys": list(policy.cfg.read_keys),
    }
    with tempfile.TemporaryDirectory() as tmp:
        intake = Intake(TransitionLog(Path(tmp)), {}, max_pending=64)
        trainer = Trainer(intake)
        trainer.start()
        with LearnerServer(LearnerServerConfig(port=0), intake, spec, "bench") as server:
            server.publish(1, to_arrays(policy.state_dict()))
            for batch in (16, 256):
                rate = transport(server, batch, args.batches, f"transport-{batch}")
                print(
                    f"transport, batches of {batch:3d}: {rate:9,.0f} transitions/s "
                    f"({rate / batch:,.0f} acks/s)"
                )
            rate = sim_actor(server, cfg.env, args.batch_steps, args.decisions)
            print(
                f"sim actor, Pendulum-v1, batches of {args.batch_steps}: {rate:,.0f} transitions/s "
                "acknowledged"
            )
            fetch, load, size = pull_latency(server, policy, args.pulls)
            params = sum(p.numel() for p in policy.parameters())
            print(
                f"weight pull ({params:,} parameters, {size / 1e6:.2f} MB message): {fetch:.1f} ms "
                f"request to unpacked state, {load:.1f} ms to load it into the policy "
                f"(medians of {args.pulls})"
            )
        trainer.stopping.set()
        intake.close()


if __name__ == "__main__":
    main()
