"""Policy server latency: p50/p99 round trip and throughput of `embodrl serve` beside bare `act`.

Each nano policy is built from its preset, saved as a checkpoint in a temporary folder and served
by `PolicyServer(CheckpointRunner(...))` in its own process (as `embodrl serve` runs), bound to
127.0.0.1 on a free port. 1, 4 and 16 `PolicyClient`s (threads of this process) each send a fixed
number of openpi-style requests back to back over loopback. The limit beside it is the same
checkpoint's `policy.act` in this process on an already-built TensorDict (batch 1, and batch c,
which is what the server's batching can reach at c clients). The server process exits when this
one closes the pipe to it, so it never outlives the benchmark.

    python benchmarks/serve_latency.py            # 200 requests per concurrency level, ~3 minutes
    python benchmarks/serve_latency.py --quick    # 64 requests per level, about a minute
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict

from embodrl.config import compose
from embodrl.deploy.client import PolicyClient
from embodrl.deploy.config import ServerConfig
from embodrl.deploy.runner import CheckpointRunner
from embodrl.deploy.server import PolicyServer
from embodrl.policies.registry import make_policy

IMAGE_SIZE, STATE_DIM = 64, 9
PROMPT = "pick up the red cube"
CONCURRENCY = (1, 4, 16)
TARGET_OVERHEAD_MS = 5.0  # issue 6: p50 overhead over bare inference


@dataclass(frozen=True)
class NanoPolicy:
    """A nano policy preset and the observation keys it is served with."""

    name: str
    preset: str  # configs/policy/<preset>.yaml
    obs_keys: tuple[str, ...]


POLICIES = (
    NanoPolicy("gaussian MLP (state)", "gaussian_state", ("state",)),
    NanoPolicy("flow VLA nano (rgb 64 + state + prompt)", "flow_vla_nano", ("rgb", "state")),
    NanoPolicy("OFT autoregressive nano (rgb 64 + state + prompt)", "openvla_oft_nano", ("rgb", "state")),
)


def save_checkpoint(spec: NanoPolicy, directory: Path) -> Path:
    """Build the preset's policy with random weights (deploy-safe keys only) and save it."""
    keys = "[" + ",".join(spec.obs_keys) + "]"
    cfg = compose(None, [f"policy={spec.preset}", f"policy.obs_keys={keys}", "policy.value_obs_keys=[]"])
    torch.manual_seed(0)
    policy = make_policy(cfg.policy, {"rgb": (IMAGE_SIZE, IMAGE_SIZE, 3), "state": (STATE_DIM,)})
    policy.save_pretrained(directory)
    return directory


def make_request(rng: np.random.Generator) -> dict:
    """An openpi-style request (image already at the policy's size, so no server-side resize)."""
    return {
        "observation/image": rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8),
        "observation/state": rng.standard_normal(STATE_DIM).astype(np.float32),
        "prompt": PROMPT,
    }


def serve_until_closed(checkpoint: str, threads: int, conn: Connection) -> None:
    """Child process: serve the checkpoint on 127.0.0.1, report the port, stop when the pipe closes."""
    torch.set_num_threads(threads)
    server = PolicyServer(CheckpointRunner(checkpoint), ServerConfig(host="127.0.0.1", port=0)).start()
    conn.send(server.port)
    try:
        conn.recv()  # any message, or EOFError once the parent is gone
    except EOFError:
        pass
    server.stop()


def bare_act_ms(runner: CheckpointRunner, batch: int, calls: int) -> list[float]:
    """Milliseconds per `policy.act` on a prebuilt batch of `batch` observations (after 3 warm-up calls)."""
    obs = TensorDict(
        {
            key: torch.zeros(batch, *spec.shape, dtype=getattr(torch, spec.dtype))
            for key, spec in runner.input_spec.items()
            if spec.dtype != "str"
        },
        batch_size=[batch],
    )
    obs["instruction"] = [PROMPT] * batch
    times = []
    with torch.inference_mode():
        for i in range(calls + 3):
            start = time.perf_counter()
            runner.policy.act(obs, deterministic=True)
            if i >= 3:
                times.append(1000 * (time.perf_counter() - start))
    return times


def load_test(port: int, clients: int, requests_per_client: int) -> tuple[list[float], float]:
    """Round-trip milliseconds of every request and the requests/s of `clients` closed-loop clients."""
    connections = [PolicyClient(f"ws://127.0.0.1:{port}") for _ in range(clients)]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)

    def run(i: int) -> None:
        rng = np.random.default_rng(i)
        requests = [make_request(rng) for _ in range(requests_per_client)]
        connections[i].infer(requests[0])  # warm-up, not counted
        barrier.wait()
        for request in requests:
            start = time.perf_counter()
            connections[i].infer(request)
            latencies[i].append(1000 * (time.perf_counter() - start))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    for connection in connections:
        connection.close()
    return [t for per_client in latencies for t in per_client], clients * requests_per_client / wall


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def benchmark(spec: NanoPolicy, requests_per_level: int, threads: int, workdir: Path) -> None:
    """Print the table rows (markdown) of one policy at every concurrency level."""
    checkpoint = save_checkpoint(spec, workdir / spec.preset)
    runner = CheckpointRunner(checkpoint)
    bare = {c: bare_act_ms(runner, c, requests_per_level) for c in CONCURRENCY}
    parent, child = mp.get_context("spawn").Pipe()
    server = mp.get_context("spawn").Process(
        target=serve_until_closed, args=(str(checkpoint), threads, child), daemon=True
    )
    server.start()
    child.close()
    try:
        if not parent.poll(120):
            raise RuntimeError("the policy server process did not report its port within 120 s")
        port = parent.recv()
        bare1, bare1_p99 = statistics.median(bare[1]), percentile(bare[1], 99)
        for clients in CONCURRENCY:
            latencies, throughput = load_test(port, clients, max(1, requests_per_level // clients))
            p50 = percentile(latencies, 50)
            bare_c = statistics.median(bare[clients])
            cells = [
                spec.name,
                str(clients),
                *(f"{v:.2f}" for v in (bare1, bare1_p99, bare_c, p50, percentile(latencies, 99))),
                f"{throughput:,.0f}",
                f"{1000 * clients / bare_c:,.0f}",
                f"{p50 - bare1:+.2f}",
                f"{p50 - bare_c:+.2f}",
            ]
            print("| " + " | ".join(cells) + " |", flush=True)
    finally:
        parent.close()  # the server process stops itself on EOF
        server.join(timeout=30)
        if server.is_alive():
            server.terminate()  # our own child, by handle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 requests per concurrency level")
    parser.add_argument("--requests", type=int, default=200, help="requests per concurrency level")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, server and bare act alike")
    args = parser.parse_args()
    requests = 64 if args.quick else args.requests
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} torch thread(s), {requests} requests per level\n")
    print(
        "| policy | clients | bare act p50 ms | bare act p99 ms | bare act [c obs] p50 ms | server p50 ms "
        "| server p99 ms | server req/s | bare req/s at batch c | p50 overhead ms | vs bare [c obs] ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="embodrl-serve-bench-") as workdir:
        for spec in POLICIES:
            benchmark(spec, requests, args.threads, Path(workdir))
    print(
        "\np50 overhead = server p50 (round trip) - bare act p50 at batch 1 "
        f"(target < {TARGET_OVERHEAD_MS} ms at 1 client); at c clients a request also waits for the "
        "batch in flight, so the last column compares with one batched act of c observations"
    )


if __name__ == "__main__":
    main()
