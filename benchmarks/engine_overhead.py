"""The engine's fixed costs per message and per decision, by transport.

1. Channel round trip: a request and its reply through an echo worker in a child process, for
   StepResult-like TensorDicts (11 tensors) with and without rgb frames (multiprocess transport).
2. One cheap env (HalfCheetah-v5, N=1, Gaussian MLP): env-steps/s of a 2048-decision sequential
   rollout with the env worker on a thread (`inproc`) or on the caller's thread (`inline`), the
   rollouts of both taken in turns and the median reported.

    python benchmarks/engine_overhead.py            # 50 round trips per payload, 4 rollouts each
    python benchmarks/engine_overhead.py --quick    # 10 round trips, 2 rollouts of 512 decisions
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.multiprocessing as mp
from tensordict import TensorDict

from embodrl.config import compose
from embodrl.data.rollout_buffer import RolloutBuffer
from embodrl.engine.channel import Header, make_channel
from embodrl.engine.env_client import StagedEnv
from embodrl.engine.schedules import make_schedule
from embodrl.train.policy_setup import build_policy


def _echo(requests, replies) -> None:
    while True:
        header, payload = requests.get()
        replies.put(header, payload)
        if header.kind == "close":
            return


def _step_like(n: int, image: int) -> TensorDict:
    obs = {"state": torch.randn(n, 20), "task_id": torch.zeros(n, dtype=torch.long)}
    if image:
        obs["rgb"] = torch.randint(0, 255, (n, image, image, 3), dtype=torch.uint8)
    obs = TensorDict(obs, [n])
    flags = {k: torch.zeros(n, dtype=torch.bool) for k in ("terminated", "truncated", "success")}
    rest = {"reward": torch.randn(n, 4), "steps_executed": torch.ones(n, dtype=torch.long), **flags}
    return TensorDict({"obs": obs, "final_obs": obs.clone(), **rest}, [n])


def channel_round_trips(repeats: int) -> None:
    requests, replies = make_channel("multiprocess"), make_channel("multiprocess")
    worker = mp.get_context("spawn").Process(target=_echo, args=(requests, replies), daemon=True)
    worker.start()
    for n, image in ((8, 0), (32, 0), (32, 64), (32, 128)):
        payload = _step_like(n, image)
        for _ in range(5):  # warm-up: the first message of a layout carries its shared-memory slot
            requests.put(Header("step"), payload)
            replies.get(timeout=60)
        start = time.perf_counter()
        for _ in range(repeats):
            requests.put(Header("step"), payload)
            replies.get(timeout=60)
        ms = (time.perf_counter() - start) / repeats * 1e3
        size = payload.bytes() / 1e6
        print(f"multiprocess round trip, N={n}, rgb {image or '-'}: {ms:.2f} ms ({size:.2f} MB)")
    requests.put(Header("close"))
    replies.get(timeout=60)
    worker.join(timeout=30)


def rollout_rates(decisions: int, repeats: int) -> None:
    base = ["env=halfcheetah", "env.num_envs=1", "policy.family=gaussian", "policy.chunk_size=1"]
    base += ["policy.action_dim=6", "policy.obs_keys=[state]"]
    schedules, envs = {}, []
    for transport in ("inproc", "inline"):
        cfg = compose(None, [*base, f"engine.transport={transport}"])
        env = StagedEnv(cfg.env, cfg.engine)
        envs.append(env)
        torch.manual_seed(0)
        policy = build_policy(cfg, env)
        schedules[transport] = make_schedule(cfg.engine, env, policy, RolloutBuffer(decisions, 1), "cpu")
        schedules[transport].push_weights(policy, 0)
    rates: dict[str, list[float]] = {name: [] for name in schedules}
    for _ in range(repeats):  # in turns, so a busy spell of the machine hits both alike
        for name, schedule in schedules.items():
            start = time.perf_counter()
            schedule.collect(lambda: torch.arange(1))
            rates[name].append(decisions / (time.perf_counter() - start))
    for env in envs:
        env.close()
    inproc = statistics.median(rates["inproc"])
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"HalfCheetah N=1 rollout, {name}: {rate:,.0f} env-steps/s ({rate / inproc:.2f}x inproc)")


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--quick", action="store_true", help="10 round trips, 2 rollouts of 512 decisions")
    args = parser.parse_args()
    torch.set_num_threads(1)
    channel_round_trips(10 if args.quick else 50)
    rollout_rates(512 if args.quick else 2048, 2 if args.quick else 4)


if __name__ == "__main__":
    main()
