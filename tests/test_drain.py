"""Graceful drain under load: SIGTERM -> health NOT_SERVING / 503 first, then no new requests,
in-flight ones finish, exit 0; a gateway takes a draining upstream out before it closes, and a
draining gateway loses no admitted call. 'Admitted' = the first token reached the client."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

from tests.support.procs import Server

pytestmark = pytest.mark.slow
TOKENS = 30


@dataclass
class Call:
    t0: float
    t_end: float = 0.0
    chunks: int = 0
    tokens: int = 0
    status: str = ""


class GrpcLoad:
    """``n`` threads, each sending streaming calls back to back until stopped."""

    def __init__(self, target: str, n: int, max_tokens: int = TOKENS, stream: bool = True) -> None:
        self.target, self.n, self.max_tokens, self.stream = target, n, max_tokens, stream
        self.calls: list[Call] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]

    def __enter__(self) -> GrpcLoad:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _run(self) -> None:
        with grpc.insecure_channel(self.target) as ch:
            stub = llm_pb2_grpc.LLMStub(ch)
            while not self.stop.is_set():
                c = Call(time.monotonic())
                self.calls.append(c)
                req = llm_pb2.GenerateRequest(prompt="hello there", max_tokens=self.max_tokens, ignore_eos=True)
                try:
                    if self.stream:
                        for chunk in stub.GenerateStream(req, timeout=30):
                            c.chunks += 1
                            c.tokens += len(chunk.token_ids)
                    else:
                        resp = stub.Generate(req, timeout=30)
                        c.chunks, c.tokens = 1, resp.usage.completion_tokens
                    c.status = "OK"
                except grpc.RpcError as exc:
                    c.status = exc.code().name
                    time.sleep(0.02)
                c.t_end = time.monotonic()


class SseLoad(GrpcLoad):
    def _run(self) -> None:
        while not self.stop.is_set():
            c = Call(time.monotonic())
            self.calls.append(c)
            body = json.dumps(
                {"prompt": "hello there", "max_tokens": self.max_tokens, "ignore_eos": True, "stream": True}
            ).encode()
            req = urllib.request.Request(
                f"{self.target}/v1/generate", data=body, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    for line in r:
                        if line.startswith(b"data: {"):
                            ev = json.loads(line[6:])
                            if "error" in ev:
                                c.status = ev["error"]["status"]
                                break
                            c.chunks += 1
                            c.tokens += len(ev.get("token_ids") or ())
                    c.status = c.status or "OK"
            except urllib.error.HTTPError as exc:
                c.status = str(exc.code)
            except OSError as exc:
                c.status = f"conn: {type(exc).__name__}"
                time.sleep(0.02)
            c.t_end = time.monotonic()


def check_nothing_admitted_was_lost(calls: list[Call], t_sig: float) -> int:
    """Every call that got a first token finished with every token; returns how many were in flight at SIGTERM."""
    admitted = [c for c in calls if c.chunks > 0]
    lost = [c for c in admitted if c.status != "OK" or c.tokens != TOKENS]
    assert not lost, lost[:5]
    refused = [c for c in calls if c.chunks == 0 and c.status not in ("", "OK")]
    assert all(c.t0 >= t_sig - 0.05 for c in refused), refused[:5]  # only calls sent while draining fail
    return sum(1 for c in admitted if c.t0 < t_sig < c.t_end)


@pytest.mark.parametrize("front", ["aiohttp", "fastapi", "aiohttp+engine-process"])
def test_server_drains_under_load(tmp_path, front) -> None:
    front, _, apart = front.partition("+")
    srv = Server(
        tmp_path,
        "--engine",
        "synthetic",
        "--decode-ms-per-token",
        "20",
        "--max-batch-size",
        "16",
        "--drain-delay-s",
        "0.6",
        "--drain-grace-s",
        "10",
        "--http-server",
        front,
        *(["--engine-process"] if apart else []),
    )
    try:
        with GrpcLoad(srv.grpc_target, 4) as g, SseLoad(srv.http_url, 3) as h:
            time.sleep(1.0)
            t_sig = time.monotonic()
            srv.popen.send_signal(signal.SIGTERM)
            # health goes first: NOT_SERVING and 503 while the ports are still open
            time.sleep(0.15)
            with grpc.insecure_channel(srv.grpc_target) as ch:
                resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
            assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(urllib.error.HTTPError) as ei:
                urllib.request.urlopen(f"{srv.http_url}/healthz", timeout=2)
            assert ei.value.code == 503 and json.loads(ei.value.read())["status"] == "draining"
            assert srv.popen.wait(15) == 0, srv.log()
            t_exit = time.monotonic()
        in_flight = check_nothing_admitted_was_lost(g.calls + h.calls, t_sig)
        assert in_flight >= 4, "the test must catch requests in flight"
        # the grace is used, not cut: the last admitted call ended just before the exit
        assert t_exit - t_sig < 10
    finally:
        srv.stop()


def test_gateway_takes_a_draining_upstream_out_first(tmp_path) -> None:
    """Two servers behind a per-call balancing gateway; one drains: not one call fails."""
    from tests.test_gateway import Gateway

    a = Server(tmp_path, "--engine", "synthetic", "--decode-ms-per-token", "2", "--drain-delay-s", "1.5")
    b = Server(tmp_path, "--engine", "synthetic", "--decode-ms-per-token", "2")
    gw = Gateway(
        tmp_path,
        "passthrough",
        f"{a.grpc_target},{b.grpc_target}",
        "--impl",
        "grpc",
        "--health-interval",
        "0.2",
        "--unhealthy-after",
        "1",
    )
    try:
        with GrpcLoad(gw.target, 4, stream=False) as g:
            time.sleep(1.0)
            t_sig = time.monotonic()
            a.popen.send_signal(signal.SIGTERM)
            assert a.popen.wait(15) == 0, a.log()
            time.sleep(0.5)
        assert {c.status for c in g.calls if c.status} == {"OK"}, [c for c in g.calls if c.status != "OK"][:5]
        after = [c for c in g.calls if c.t0 > t_sig + 1.6]
        assert len(after) > 10  # the load went on through the other server
        m = gw.metrics()
        assert m[f'pathprobe_gateway_upstream_healthy{{upstream="{a.grpc_target}"}}'] == 0.0
    finally:
        gw.stop()
        a.stop()
        b.stop()


MODES = [
    ("passthrough", ("--impl", "h2")),
    ("passthrough", ("--impl", "grpc")),
    ("transcode", ()),
    ("reencode", ()),
    ("http-proxy", ()),
]


@pytest.mark.parametrize(
    "mode, extra", MODES, ids=["passthrough-h2", "passthrough-grpc", "transcode", "reencode", "http-proxy"]
)
def test_gateway_drains_under_load(tmp_path, mode, extra) -> None:
    from tests.test_gateway import Gateway

    srv = Server(tmp_path, "--engine", "synthetic", "--decode-ms-per-token", "20", "--max-batch-size", "16")
    up = f"127.0.0.1:{srv.http_port}" if mode in ("reencode", "http-proxy") else srv.grpc_target
    gw = Gateway(tmp_path, mode, up, *extra, "--drain-grace-s", "10")
    http = mode in ("transcode", "http-proxy")
    try:
        load = SseLoad(gw.url, 4) if http else GrpcLoad(gw.target, 4)
        with load:
            time.sleep(1.0)
            t_sig = time.monotonic()
            gw.popen.send_signal(signal.SIGTERM)
            assert gw.popen.wait(15) == 0, gw.log()
        in_flight = check_nothing_admitted_was_lost(load.calls, t_sig)
        assert in_flight >= 2, "the test must catch calls in flight"
    finally:
        gw.stop()
        srv.stop()
