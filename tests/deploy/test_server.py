"""Policy server + client: round trips, malformed requests, API key, health under load, batching."""

import logging
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import msgpack
import numpy as np
import pytest
from websockets.sync.client import connect

from embodrl.deploy.client import PolicyClient, ServerError
from embodrl.deploy.config import ServerConfig
from embodrl.deploy.protocol import packb
from embodrl.deploy.server import PolicyServer
from embodrl.errors import UserError
from tests.deploy.fakes import HORIZON, IMAGE_SIZE, FakeRunner, expected_chunk, request


def _serve(runner=None, **cfg) -> PolicyServer:
    cfg = {"host": "127.0.0.1", "port": 0, "request_timeout_s": 5.0, **cfg}
    return PolicyServer(runner or FakeRunner(), ServerConfig(**cfg)).start()


@pytest.fixture
def server():
    srv = _serve()
    yield srv
    srv.stop()


def _url(srv: PolicyServer) -> str:
    return f"ws://127.0.0.1:{srv.port}"


def _wait_until(condition, what: str, attempts: int = 500) -> None:
    for _ in range(attempts):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_round_trip_with_client(server):
    with PolicyClient(_url(server)) as client:
        assert client.metadata["action_horizon"] == HORIZON
        assert client.metadata["observation_keys"]["image"] == "observation/image"
        reply = client.infer(request(state=(1.0, 2.0)))
    np.testing.assert_allclose(reply["actions"], expected_chunk(np.array([1.0, 2.0])))
    assert reply["actions"].dtype == np.float32
    assert {"infer_ms", "total_ms"} <= set(reply["server_timing"]) and "infer_ms" in reply["policy_timing"]
    assert server.runner.image_shapes == [(IMAGE_SIZE, IMAGE_SIZE, 3)]  # resized server-side
    assert server.runner.instructions == ["pick"]


def _openpi_pack(obj):
    """The encoder of openpi_client.msgpack_numpy, written out so this test imports nothing of embodrl."""
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    return obj


def _openpi_unpack(obj):
    if b"__ndarray__" in obj:
        return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=obj[b"shape"])
    return obj


def test_raw_protocol_client(server):
    """A client written against the protocol alone (msgpack + websockets), as openpi's client is."""
    packer = msgpack.Packer(default=_openpi_pack)
    with connect(_url(server), compression=None, max_size=None) as ws:
        metadata = msgpack.unpackb(ws.recv(), object_hook=_openpi_unpack)
        assert metadata["action_dim"] == 3
        for step in range(3):
            ws.send(packer.pack(request(state=(step, 0.0))))
            reply = msgpack.unpackb(ws.recv(), object_hook=_openpi_unpack)
            np.testing.assert_allclose(reply["actions"], expected_chunk(np.array([step, 0.0])))
            if step > 0:
                assert reply["server_timing"]["prev_total_ms"] > 0


def _malformed_requests() -> list[bytes | str]:
    good = packb(request())
    rng = np.random.default_rng(0)
    complex_image = request()
    complex_image["observation/image"] = {
        b"__ndarray__": True,
        b"data": b"\0" * 16,
        b"dtype": "<c8",
        b"shape": [2],
    }
    return [
        good[: len(good) // 2],  # truncated msgpack
        bytes(rng.integers(0, 256, 64, dtype=np.uint8)),  # noise
        "a text frame",
        packb([1, 2, 3]),  # not a map
        packb({k: v for k, v in request().items() if k != "observation/state"}),  # missing key
        packb({**request(), "observation/state": np.zeros(5, np.float32)}),  # wrong shape
        packb({**request(), "observation/state": np.array(["a", "b"])}),  # wrong dtype
        packb({**request(), "observation/state": np.array([np.nan, 0], np.float32)}),  # non-finite
        packb({**request(), "observation/image": np.zeros((8, 8, 3), np.float32)}),  # float image
        packb({**request(), "observation/image": np.zeros((3, 8, 8), np.uint8)}),  # CHW image
        packb({**request(), "prompt": 5}),  # prompt not a string
        msgpack.packb(complex_image, default=_openpi_pack),  # complex dtype
        packb(request(state=(999, 0))),  # the policy itself fails on it
    ]


def test_malformed_requests_get_error_replies_and_server_keeps_serving(server):
    with PolicyClient(_url(server)) as client, connect(_url(server)) as raw:
        raw.recv()  # metadata
        for bad in _malformed_requests():
            raw.send(bad)
            reply = raw.recv(timeout=5)
            assert isinstance(reply, str) and reply.startswith("error:"), reply
        raw.send(packb(request()))  # the same connection still works
        assert isinstance(raw.recv(timeout=5), bytes)
        np.testing.assert_allclose(client.infer(request())["actions"], expected_chunk(np.array([0.5, 1.0])))
        with pytest.raises(ServerError, match="lacks"):
            client.infer({"prompt": "no observations"})
    assert server.stats.errors == len(_malformed_requests()) + 1


def test_oversize_message_closes_only_that_connection():
    srv = _serve(max_message_bytes=10_000)
    try:
        with PolicyClient(_url(srv)) as bystander, PolicyClient(_url(srv)) as sender:
            with pytest.raises(ServerError, match="1009"):
                sender.infer(request(image_shape=(100, 100, 3)))
            assert bystander.infer(request())["actions"].shape == (HORIZON, 3)
        with PolicyClient(_url(srv)) as fresh:
            assert fresh.infer(request())["actions"].shape == (HORIZON, 3)
    finally:
        srv.stop()


def test_api_key_is_enforced():
    srv = _serve(api_key="s3cret")
    try:
        with pytest.raises(ServerError, match="401"):
            PolicyClient(_url(srv))
        with pytest.raises(ServerError, match="401"):
            PolicyClient(_url(srv), api_key="wrong")
        with PolicyClient(_url(srv), api_key="s3cret") as client:
            assert client.infer(request())["actions"].shape == (HORIZON, 3)
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/healthz", timeout=5) as response:
            assert response.status == 200  # health needs no key
    finally:
        srv.stop()


def test_refusals_are_logged_with_the_client_and_reason_never_the_payload(caplog):
    caplog.set_level(logging.INFO, logger="embodrl.deploy.server")
    srv = _serve(api_key="s3cret")
    try:
        assert f"serving on 127.0.0.1:{srv.port}" in caplog.text  # only once bound
        with pytest.raises(ServerError, match="401"):
            PolicyClient(_url(srv), api_key="wrong")
        with PolicyClient(_url(srv), api_key="s3cret") as client, pytest.raises(ServerError):
            client.infer({**request(), "observation/state": np.full(5, 7.25, np.float32)})  # wrong shape
    finally:
        srv.stop()
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 2 and all("from 127.0.0.1:" in line for line in refusals)
    assert "Api-Key" in refusals[0] and "7.25" not in caplog.text


def test_binding_beyond_loopback_without_a_key_warns_and_the_key_may_come_from_the_environment(
    caplog, monkeypatch
):
    caplog.set_level(logging.INFO, logger="embodrl.deploy.server")
    srv = _serve(host="0.0.0.0")
    srv.stop()
    assert "without an API key" in caplog.text
    monkeypatch.setenv("EMBODRL_API_KEY", "from-env")
    assert ServerConfig().api_key == "from-env" and ServerConfig(api_key="given").api_key == "given"


def test_healthz_and_other_clients_answer_while_inference_is_slow(server):
    runner = server.runner
    runner.gate.clear()
    client = PolicyClient(_url(server))
    result = {}
    slow = threading.Thread(target=lambda: result.update(client.infer(request())))
    slow.start()
    try:
        assert runner.started.wait(timeout=5)
        for _ in range(3):
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=2) as response:
                assert response.read() == b"OK\n"
        with PolicyClient(_url(server)) as other:  # handshake too is served during inference
            assert other.metadata["action_horizon"] == HORIZON
        assert "actions" not in result
    finally:
        runner.gate.set()
        slow.join(timeout=10)
        client.close()
    assert result["actions"].shape == (HORIZON, 3)


def test_request_timeout_gives_error_and_connection_survives():
    runner = FakeRunner()
    srv = _serve(runner, request_timeout_s=0.2)
    try:
        with PolicyClient(_url(srv)) as client:
            runner.gate.clear()
            with pytest.raises(ServerError, match="request_timeout_s"):
                client.infer(request())
            runner.gate.set()
            np.testing.assert_allclose(
                client.infer(request())["actions"], expected_chunk(np.array([0.5, 1.0]))
            )
    finally:
        srv.stop()


def test_concurrent_requests_are_batched_and_a_bad_one_fails_alone():
    runner = FakeRunner()
    srv = _serve(runner)
    clients = [PolicyClient(_url(srv)) for _ in range(4)]
    results: dict[int, object] = {}

    def ask(i: int, state) -> None:
        try:
            results[i] = clients[i].infer(request(state=state))["actions"]
        except ServerError as error:
            results[i] = error

    try:
        runner.gate.clear()
        first = threading.Thread(target=ask, args=(0, (0.0, 0.0)))
        first.start()
        assert runner.started.wait(timeout=5)  # the worker is busy with request 0
        others = [threading.Thread(target=ask, args=(i, (999 if i == 3 else i, 0.0))) for i in (1, 2, 3)]
        for thread in others:
            thread.start()
        _wait_until(lambda: srv._queue.qsize() == 3, "3 queued requests")
        runner.gate.set()
        for thread in [first, *others]:
            thread.join(timeout=10)
    finally:
        runner.gate.set()
        for client in clients:
            client.close()
        srv.stop()
    assert runner.batch_sizes[0] == 1 and 3 in runner.batch_sizes  # 1, then 3 together (then retried alone)
    for i in (0, 1, 2):
        np.testing.assert_allclose(results[i], expected_chunk(np.array([i, 0.0])))
    assert isinstance(results[3], ServerError) and "poisoned" in str(results[3])


def test_client_imports_without_torch():
    code = "import sys, embodrl.deploy.client; assert 'torch' not in sys.modules, 'client pulled in torch'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_unreachable_server_fails_fast():
    srv = _serve()
    port = srv.port
    srv.stop()
    with pytest.raises(ServerError, match=r"cannot connect to ws://127.0.0.1:\d+: Connection refused"):
        PolicyClient(f"ws://127.0.0.1:{port}", wait_s=0.0)  # a one-line error, no traceback
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_port_in_use_is_a_user_error(server):
    with pytest.raises(UserError, match="choose another server.port"):
        _serve(port=server.port)


def _random_value(rng: np.random.Generator, depth: int = 0):
    kind = rng.integers(0, 8 if depth < 2 else 5)
    if kind == 0:
        return int(rng.integers(-(2**40), 2**40))
    if kind == 1:
        return "x" * int(rng.integers(0, 50))
    if kind == 2:
        return float(rng.normal())
    if kind == 3:
        return bytes(rng.integers(0, 256, int(rng.integers(0, 20)), dtype=np.uint8))
    if kind == 4:
        dtype = rng.choice(["uint8", "float32", "float64", "int64", "bool", "int8"])
        shape = tuple(int(d) for d in rng.integers(0, 20, rng.integers(0, 4)))
        return (rng.random(shape) * 300).astype(dtype)
    if kind == 5:
        return [_random_value(rng, depth + 1) for _ in range(rng.integers(0, 4))]
    if kind == 6:
        return {str(i): _random_value(rng, depth + 1) for i in range(rng.integers(0, 4))}
    return None


def test_random_requests_are_all_answered(server):
    rng = np.random.default_rng(1)
    keys = ["observation/image", "observation/state", "prompt", "other"]
    with connect(_url(server)) as ws:
        ws.recv()
        for _ in range(150):
            chosen = [k for k in keys if rng.random() < 0.7]
            ws.send(packb({k: _random_value(rng) for k in chosen}))
            assert ws.recv(timeout=5) is not None
        ws.send(packb(request()))
        assert isinstance(ws.recv(timeout=5), bytes)


def test_the_client_reconnects_with_backoff_to_a_restarted_server():
    """Once, after a server restart the client never reconnected (20 s of failures, then a safe stop)."""
    srv = _serve()
    port = srv.port
    client = PolicyClient(_url(srv), reconnect_s=0.2, max_reconnect_s=0.4)
    assert client.infer(request())["actions"].shape == (HORIZON, 3)
    srv.stop()
    with pytest.raises(ServerError, match="closed|cannot connect"):
        client.infer(request())  # the connection is gone
    with pytest.raises(ServerError):
        client.infer(request())  # the server is down: tried now, then not before the backoff
    with pytest.raises(ServerError, match=r"reconnecting to .* \(next try in"):
        client.infer(request())  # within the backoff: no try, an immediate error (the loop holds)
    restarted = _serve(port=port)
    try:
        deadline = time.monotonic() + 5
        while True:
            try:
                reply = client.infer(request())
                break
            except ServerError:
                assert time.monotonic() < deadline, "no reconnection within 5 s"
                time.sleep(0.05)
        assert reply["actions"].shape == (HORIZON, 3)
    finally:
        client.close()
        restarted.stop()
