"""Several upstreams: balancing, health checks taking one out and back, failover mid-run."""

from __future__ import annotations

import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from pathprobe.errors import Unavailable
from pathprobe.gateway.upstreams import Pool
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

from tests.support.clients import grpc_generate, http_post
from tests.support.procs import Proc, Server, free_port, wait_grpc, wait_http
from tests.test_gateway import REQ, Gateway, wait_until

SYNTH = (
    "--engine",
    "synthetic",
    "--prefill-ms-per-token",
    "0.05",
    "--decode-ms-per-token",
    "1",
    "--max-batch-size",
    "16",
)


# ------------------------------------------------------------------------------ unit: the pool
def test_pool_round_robin_and_least_outstanding() -> None:
    pool = Pool(["a:1", "b:2", "c:3"], "grpc", "round-robin")
    picks = [pool.acquire().target for _ in range(6)]
    assert sorted(picks) == ["a:1", "a:1", "b:2", "b:2", "c:3", "c:3"]
    pool.upstreams[1].mark(False, "test")
    picks = {pool.acquire().target for _ in range(6)}
    assert picks == {"a:1", "c:3"}
    pool.upstreams[1].mark(True)

    lo = Pool(["a:1", "b:2"], "grpc", "least-outstanding")
    first = lo.acquire()
    second = lo.acquire()
    assert first is not second  # the busy one is avoided
    lo.release(first)
    assert lo.acquire() is first
    # all unhealthy: still tried (health data may be stale), and exclusion is honoured
    for u in lo.upstreams:
        u.mark(False, "test")
    assert lo.acquire() in lo.upstreams
    with pytest.raises(Unavailable):
        lo.acquire(exclude=tuple(lo.upstreams))


# ------------------------------------------------------------------------------ two servers
def requests_of(srv: Server) -> float:
    with urllib.request.urlopen(f"{srv.http_url}/metrics", timeout=5) as r:
        total = 0.0
        for line in r.read().decode().splitlines():
            if line.startswith("pathprobe_server_requests_total{") and 'route="grpc.Generate"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory) -> Iterator[tuple[Server, Server]]:
    tmp = tmp_path_factory.mktemp("two")
    a = Server(tmp, *SYNTH)
    b = Server(tmp, *SYNTH)
    yield a, b
    a.stop()
    b.stop()


@pytest.mark.parametrize("impl", ["grpc", "h2"])
def test_round_robin_spreads_calls(tmp_path, two_servers, impl: str) -> None:
    a, b = two_servers
    gw = Gateway(tmp_path, "passthrough", f"{a.grpc_target},{b.grpc_target}", "--impl", impl)
    try:
        before = requests_of(a), requests_of(b)
        if impl == "grpc":  # per call, over one client connection
            with grpc.insecure_channel(gw.target) as ch:
                stub = llm_pb2_grpc.LLMStub(ch)
                for _ in range(10):
                    stub.Generate(llm_pb2.GenerateRequest(**REQ), timeout=10)
        else:  # the frame relay balances client connections: ten clients, one connection each
            chans = [
                grpc.insecure_channel(gw.target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(10)
            ]
            try:
                for ch in chans:
                    llm_pb2_grpc.LLMStub(ch).Generate(llm_pb2.GenerateRequest(**REQ), timeout=10)
            finally:
                for ch in chans:
                    ch.close()
        after = requests_of(a), requests_of(b)
        assert (after[0] - before[0], after[1] - before[1]) == (5, 5)
    finally:
        gw.stop()


def test_least_outstanding_avoids_the_busy_upstream(tmp_path, two_servers) -> None:
    a, b = two_servers
    gw = Gateway(
        tmp_path, "passthrough", f"{a.grpc_target},{b.grpc_target}", "--impl", "grpc", "--balance", "least-outstanding"
    )
    try:
        with grpc.insecure_channel(gw.target) as ch:
            stub = llm_pb2_grpc.LLMStub(ch)
            long = stub.GenerateStream(llm_pb2.GenerateRequest(prompt="x", max_tokens=3000, ignore_eos=True))
            next(long)  # now one upstream has a call in flight
            before = requests_of(a), requests_of(b)
            for _ in range(6):
                stub.Generate(llm_pb2.GenerateRequest(**REQ), timeout=10)
            after = requests_of(a), requests_of(b)
            long.cancel()
        got = (after[0] - before[0], after[1] - before[1])
        assert sorted(got) == [0, 6], got
    finally:
        gw.stop()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["passthrough", "passthrough-h2", "transcode", "http-proxy"])
def test_health_check_takes_out_and_puts_back(tmp_path, mode: str) -> None:
    """An upstream that stops is marked unhealthy and gets no calls; back up, it gets calls again."""
    a = Server(tmp_path, *SYNTH)
    b_grpc, b_http = free_port(), free_port()
    b_args = [
        sys.executable,
        "-m",
        "pathprobe",
        "serve",
        "--grpc-port",
        str(b_grpc),
        "--http-port",
        str(b_http),
        *SYNTH,
    ]

    def start_b() -> Proc:
        p = Proc(b_args, tmp_path / f"b-{time.monotonic_ns()}.log")
        wait_http(f"http://127.0.0.1:{b_http}/healthz", 60, p.popen)
        wait_grpc(f"127.0.0.1:{b_grpc}", 60, p.popen)
        return p

    b = start_b()
    http_up = mode == "http-proxy"
    ups = f"127.0.0.1:{a.http_port},127.0.0.1:{b_http}" if http_up else f"{a.grpc_target},127.0.0.1:{b_grpc}"
    b_name = f"127.0.0.1:{b_http if http_up else b_grpc}"
    impl = {"passthrough": ("--impl", "grpc"), "passthrough-h2": ("--impl", "h2")}.get(mode, ())
    mode = mode.removesuffix("-h2")
    gw = Gateway(tmp_path, mode, ups, *impl)

    def healthy(name: str) -> float:
        return gw.metrics()[f'pathprobe_gateway_upstream_healthy{{upstream="{name}"}}']

    def call_ok() -> bool:
        if mode == "passthrough":
            return bool(grpc_generate(gw.target, timeout=10, **REQ)[0].text)
        return http_post(f"{gw.url}/v1/generate", REQ)[0] == 200

    try:
        assert wait_until(lambda: healthy(b_name) == 1)
        b.stop()
        assert wait_until(lambda: healthy(b_name) == 0, 10)
        assert all(call_ok() for _ in range(8))  # every call goes to the healthy one
        b = start_b()
        assert wait_until(lambda: healthy(b_name) == 1, 20)
        assert all(call_ok() for _ in range(4))
    finally:
        gw.stop()
        b.stop()
        a.stop()


# ------------------------------------------------------------------------------ failover
@pytest.mark.slow
@pytest.mark.parametrize("impl", ["h2", "grpc"])
def test_failover_kill_one_upstream_mid_run(tmp_path, impl: str) -> None:
    """Kill one of two upstreams under load: only calls in flight on it fail, with UNAVAILABLE."""
    a = Server(tmp_path, *SYNTH)
    b = Server(tmp_path, *SYNTH)
    gw = Gateway(
        tmp_path, "passthrough", f"{a.grpc_target},{b.grpc_target}", "--impl", impl, "--balance", "least-outstanding"
    )
    results: list[tuple[float, float, str]] = []  # (start, end, code)
    lock = threading.Lock()
    stop = threading.Event()

    def worker(streaming: bool) -> None:
        # one connection per worker (no shared subchannel), so the relay spreads them over both
        with grpc.insecure_channel(gw.target, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            stub = llm_pb2_grpc.LLMStub(ch)
            req = llm_pb2.GenerateRequest(prompt="hello there", max_tokens=30, ignore_eos=True)
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    if streaming:
                        list(stub.GenerateStream(req, timeout=20))
                    else:
                        stub.Generate(req, timeout=20)
                    code = "OK"
                except grpc.RpcError as err:
                    code = err.code().name
                with lock:
                    results.append((t0, time.monotonic(), code))

    threads = [threading.Thread(target=worker, args=(i % 2 == 0,), daemon=True) for i in range(6)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.5)
        t_kill0 = time.monotonic()
        b.popen.kill()  # SIGKILL: no goodbye, connections just die
        b.popen.wait()
        t_kill1 = time.monotonic()
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a call hung"
    finally:
        stop.set()
        gw.stop()
        a.stop()
        b.stop()
    failed = [r for r in results if r[2] != "OK"]
    after = [r for r in results if r[0] > t_kill1]
    assert len(results) > 30 and len(after) > 10, (len(results), len(after))
    for start, end, code in failed:
        assert code == "UNAVAILABLE", failed
        assert start <= t_kill1 and end >= t_kill0, ("a call that was not in flight failed", start, end, t_kill0)
    assert all(code == "OK" for _, _, code in after)
    assert failed, "no call was in flight on the killed upstream: the test did not exercise failover"
