"""Gateway end to end: every mode against a real ``pathprobe serve`` (synthetic engine).

Responses through the gateway must equal the direct path; timing must carry both the
server's ``srv.*`` and the gateway's ``gw.*`` entries; errors must map as the issue says
and the gateway must keep serving after each.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from pathprobe import timing
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

from tests.support.clients import grpc_generate, grpc_stream, http_post, sse_events
from tests.support.procs import Proc, free_port

GW_ENTRIES = {"gw.decode", "gw.encode", "gw.upstream", "gw.total"}
SRV_ENTRIES = {
    "srv.decode",
    "srv.queue",
    "srv.tokenize",
    "srv.prefill",
    "srv.decode_steps",
    "srv.detokenize",
    "srv.encode",
    "srv.total",
}
REQ = {"prompt": "The capital of France is", "max_tokens": 7, "request_id": "req-1"}


# ------------------------------------------------------------------------------ helpers
class Gateway(Proc):
    """``pathprobe gateway`` on free loopback ports; waits until it accepts connections."""

    def __init__(
        self, tmp: Path, mode: str, upstream: str, *extra: str, env: dict[str, str] | None = None, timeout: float = 30.0
    ) -> None:
        self.port = free_port()
        self.admin_port = free_port()
        self.mode = mode
        args = [
            sys.executable,
            "-m",
            "pathprobe",
            "gateway",
            "--mode",
            mode,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--upstream",
            upstream,
            "--admin-port",
            str(self.admin_port),
            "--health-interval",
            "0.3",
            *extra,
        ]
        super().__init__(args, tmp / f"gateway-{mode}-{self.port}.log", env)
        deadline = time.monotonic() + timeout
        while True:
            if self.popen.poll() is not None:
                raise RuntimeError(f"gateway exited:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                with urllib.request.urlopen(f"{self.admin_url}/metrics", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"gateway not listening:\n{self.log()}") from None
                time.sleep(0.1)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def metrics(self) -> dict[str, float]:
        """Samples of /metrics as ``{'name{labels}': value}``."""
        with urllib.request.urlopen(f"{self.admin_url}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def outstanding(self) -> float:
        return sum(v for k, v in self.metrics().items() if k.startswith("pathprobe_gateway_upstream_outstanding"))


def wait_until(pred, timeout: float = 10.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def established_to(pid: int, port: int) -> int:
    """ESTABLISHED TCP connections that process ``pid`` holds to ``127.0.0.1:port``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            remote, state, inode = parts[2], parts[3], parts[9]
            if state == "01" and inode in inodes and int(remote.rsplit(":", 1)[1], 16) == port:
                n += 1
    return n


def server_gauge(srv, name: str) -> float:
    with urllib.request.urlopen(f"{srv.http_url}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def strip_timing(events: list) -> list:
    out = []
    for ev in events:
        if isinstance(ev, dict):
            ev = {k: v for k, v in ev.items() if k not in ("server_timing", "emit_ms", "fwd_ms")}  # differ per call
        out.append(ev)
    return out


def check_entries(entries: dict[str, float], decode_zero: bool = False, chunk_time_out: bool = False) -> None:
    assert set(entries) >= SRV_ENTRIES, entries
    assert set(entries) >= GW_ENTRIES, entries
    if chunk_time_out:
        # a stream whose per-chunk time is out of gw.upstream: a transcoded stream's decode/encode
        # (gw.decode / gw.encode) overlap the server's work, so gw.upstream may be below srv.total when
        # the hop is shorter than that overlap; the hand-offs (gw.send) count only what held the
        # stream's end back; what holds is no double counting inside the gateway
        send = entries.get("gw.send", 0.0)
        assert entries["gw.upstream"] > 0 and send >= 0
        own = entries["gw.upstream"] + entries["gw.decode"] + entries["gw.encode"] + send
        assert entries["gw.total"] - own >= -0.01
    else:
        # causal order (not speed): the gateway's view of the upstream call contains the server's work
        assert entries["gw.upstream"] >= entries["srv.total"] - 0.01
    assert entries["gw.total"] >= entries["gw.upstream"] - 0.01
    if decode_zero:
        assert entries["gw.decode"] == 0 and entries["gw.encode"] == 0


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module", params=["h2", "grpc"])
def passthrough(request, synthetic_server, tmp_path_factory) -> Iterator[Gateway]:
    gw = Gateway(tmp_path_factory.mktemp("gw"), "passthrough", synthetic_server.grpc_target, "--impl", request.param)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def transcode(synthetic_server, tmp_path_factory) -> Iterator[Gateway]:
    gw = Gateway(tmp_path_factory.mktemp("gw"), "transcode", synthetic_server.grpc_target, "--max-body-bytes", "20000")
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def reencode(synthetic_server, tmp_path_factory) -> Iterator[Gateway]:
    gw = Gateway(tmp_path_factory.mktemp("gw"), "reencode", f"127.0.0.1:{synthetic_server.http_port}")
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def http_proxy(synthetic_server, tmp_path_factory) -> Iterator[Gateway]:
    gw = Gateway(
        tmp_path_factory.mktemp("gw"),
        "http-proxy",
        f"127.0.0.1:{synthetic_server.http_port}",
        "--max-body-bytes",
        "20000",
    )
    yield gw
    gw.stop()


# ------------------------------------------------------------------------------ passthrough
def test_passthrough_unary_and_stream_identical(passthrough, synthetic_server) -> None:
    direct, _ = grpc_generate(synthetic_server.grpc_target, **REQ)
    via, entries = grpc_generate(passthrough.target, **REQ)
    assert via == direct and via.text
    check_entries(entries, decode_zero=True)
    d_chunks, _ = grpc_stream(synthetic_server.grpc_target, **REQ)
    v_chunks, s_entries = grpc_stream(passthrough.target, **REQ)
    assert v_chunks == d_chunks and len(v_chunks) >= 2
    check_entries(s_entries, decode_zero=True)


def test_passthrough_never_decodes(passthrough) -> None:
    """Bytes that are no GenerateRequest reach the server, which is the one to reject them."""
    with grpc.insecure_channel(passthrough.target) as ch:
        raw = ch.unary_unary("/pathprobe.v1.LLM/Generate")  # no serializers: bytes on the wire
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff\xff not protobuf", timeout=10)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    entries = timing.from_metadata(err.value.trailing_metadata())
    assert "srv.total" in entries and "gw.total" in entries  # the server answered, through the gateway


def test_passthrough_metadata_deadline_cancel(passthrough, synthetic_server) -> None:
    with grpc.insecure_channel(passthrough.target) as ch:
        stub = llm_pb2_grpc.LLMStub(ch)
        # deadline: 1000 tokens at 1 ms each cannot finish in 0.2 s
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(llm_pb2.GenerateRequest(prompt="x", max_tokens=1000, ignore_eos=True), timeout=0.2)
        assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        # cancellation of a stream half way
        call = stub.GenerateStream(llm_pb2.GenerateRequest(prompt="x", max_tokens=1000, ignore_eos=True))
        for i, _ in enumerate(call):
            if i == 3:
                call.cancel()
                break
        # the server frees the slots (no upstream stream left behind) and the gateway counts none
        assert wait_until(lambda: server_gauge(synthetic_server, "pathprobe_server_running") == 0)
        assert wait_until(lambda: passthrough.outstanding() == 0)
        # unknown method: the upstream answers, through the gateway
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary("/no.such.Service/Method")(b"", timeout=5)
        assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
        # and it keeps serving
        resp = stub.Generate(llm_pb2.GenerateRequest(**REQ), timeout=10)
        assert resp.text


def test_passthrough_metrics(passthrough) -> None:
    grpc_generate(passthrough.target, **REQ)
    m = passthrough.metrics()
    ok = [k for k in m if k.startswith("pathprobe_gateway_requests_total") and 'code="OK"' in k and "Generate" in k]
    assert ok and sum(m[k] for k in ok) >= 1
    assert any(k.startswith("pathprobe_gateway_upstream_healthy") and v == 1 for k, v in m.items())


# ------------------------------------------------------------------------------ transcode
def test_transcode_unary_and_stream_identical(transcode, synthetic_server) -> None:
    s1, _, b1 = http_post(f"{synthetic_server.http_url}/v1/generate", REQ)
    s2, h2, b2 = http_post(f"{transcode.url}/v1/generate", REQ)
    assert s1 == s2 == 200
    assert json.loads(b2) == json.loads(b1)
    check_entries(timing.parse(h2["Server-Timing"]))
    s1, _, b1 = http_post(f"{synthetic_server.http_url}/v1/generate", {**REQ, "stream": True})
    s2, _, b2 = http_post(f"{transcode.url}/v1/generate", {**REQ, "stream": True})
    e1, e2 = sse_events(b1), sse_events(b2)
    assert strip_timing(e2) == strip_timing(e1) and e2[-1] == "[DONE]"
    # the gateway rebuilt every chunk and stamped its hand-off, in order; the server stamps none
    fwd = [ev["fwd_ms"] for ev in e2[:-1]]
    assert all(f > 0 for f in fwd) and fwd == sorted(fwd) and not any("fwd_ms" in ev for ev in e1[:-1])
    last = e2[-2]
    assert last["finish_reason"]
    check_entries(timing.parse(last["server_timing"]), chunk_time_out=True)
    assert e2[-2]["server_timing"].count("gw.total") == 1


def test_transcode_errors(transcode) -> None:
    url = f"{transcode.url}/v1/generate"
    status, _, body = http_post(url, None, raw=b"{not json")
    assert status == 400 and json.loads(body)["error"]["param"] == "body"
    status, _, body = http_post(url, {"prompt": "hi", "max_tokens": "seven"})
    err = json.loads(body)["error"]
    assert status == 400 and err["param"] == "max_tokens" and err["status"] == "INVALID_ARGUMENT"
    # the server's own validation, mapped from gRPC INVALID_ARGUMENT
    status, headers, body = http_post(url, {"prompt": "", "max_tokens": 3})
    err = json.loads(body)["error"]
    assert status == 400 and err["param"] == "prompt", err
    assert "srv.total" in timing.parse(headers["Server-Timing"])
    status, _, body = http_post(f"{transcode.url}/v1/nothing", {})
    assert status == 404 and json.loads(body)["error"]["status"] == "UNIMPLEMENTED"
    status, _, body = http_post(url, {"prompt": "x" * 30000, "max_tokens": 3})
    assert status == 413 and json.loads(body)["error"]["status"] == "RESOURCE_EXHAUSTED"
    with urllib.request.urlopen(f"{transcode.url}/healthz", timeout=5) as r:
        assert r.status == 200
    status, _, body = http_post(url, REQ)
    assert status == 200  # still serving


# ------------------------------------------------------------------------------ reencode
def test_reencode_unary_and_stream_identical(reencode, synthetic_server) -> None:
    direct, _ = grpc_generate(synthetic_server.grpc_target, **REQ)
    via, entries = grpc_generate(reencode.target, **REQ)
    assert via == direct
    check_entries(entries)
    assert entries["gw.decode"] > 0 and entries["gw.encode"] > 0
    direct_offsets: list = []
    via_offsets: list = []
    d_chunks, _ = grpc_stream(synthetic_server.grpc_target, offsets=direct_offsets, **REQ)
    v_chunks, s_entries = grpc_stream(reencode.target, offsets=via_offsets, **REQ)
    assert v_chunks == d_chunks
    # the gateway rebuilt every chunk and stamped its hand-off, in order, keeping the server's emit offset
    fwd = [f for _, f in via_offsets]
    assert all(f > 0 for f in fwd) and fwd == sorted(fwd) and all(f == 0 for _, f in direct_offsets)
    assert all(e > 0 for e, _ in via_offsets)
    check_entries(s_entries, chunk_time_out=True)


def test_reencode_errors(reencode) -> None:
    with grpc.insecure_channel(reencode.target) as ch:
        stub = llm_pb2_grpc.LLMStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(llm_pb2.GenerateRequest(prompt="", max_tokens=3), timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "prompt" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary("/pathprobe.v1.LLM/Generate")(b"\xff\xff\xff", timeout=10)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # reencode does decode
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary("/no.such.Service/Method")(b"", timeout=5)
        assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(llm_pb2.GenerateRequest(prompt="x", max_tokens=1000, ignore_eos=True), timeout=0.2)
        assert err.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(llm_pb2.GenerateRequest(prompt="x" * (5 * 1024 * 1024), max_tokens=3), timeout=10)
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert stub.Generate(llm_pb2.GenerateRequest(**REQ), timeout=10).text


# ------------------------------------------------------------------------------ http-proxy
def test_http_proxy_identical(http_proxy, synthetic_server) -> None:
    s1, _, b1 = http_post(f"{synthetic_server.http_url}/v1/generate", REQ)
    s2, h2, b2 = http_post(f"{http_proxy.url}/v1/generate", REQ)
    assert s1 == s2 == 200 and b1 == b2
    entries = timing.parse(h2["Server-Timing"])
    check_entries(entries, decode_zero=True)
    s1, _, b1 = http_post(f"{synthetic_server.http_url}/v1/generate", {**REQ, "stream": True})
    s2, _, b2 = http_post(f"{http_proxy.url}/v1/generate", {**REQ, "stream": True})
    e1, e2 = sse_events(b1), sse_events(b2)
    assert strip_timing(e2) == strip_timing(e1)
    check_entries(timing.parse(e2[-2]["server_timing"]), chunk_time_out=True)
    # any route passes: the OpenAI-compatible ones too, errors included
    with urllib.request.urlopen(f"{http_proxy.url}/v1/models", timeout=5) as r:
        assert r.status == 200
        model = json.loads(r.read())["data"][0]["id"]
    oa = {"model": model, "prompt": "hi", "max_tokens": 3}
    s1, _, b1 = http_post(f"{synthetic_server.http_url}/v1/completions", oa)
    s2, h2, b2 = http_post(f"{http_proxy.url}/v1/completions", oa)
    assert s1 == s2 == 200, b2
    c1, c2 = json.loads(b1), json.loads(b2)
    assert c1["choices"] == c2["choices"] and c1["usage"] == c2["usage"]
    assert "gw.total" in timing.parse(h2.get("Server-Timing", ""))
    s, _, b = http_post(f"{http_proxy.url}/v1/generate", {"prompt": "hi", "max_tokens": "x"})
    assert s == 400 and json.loads(b)["error"]["param"] == "max_tokens"
    s, _, b = http_post(f"{http_proxy.url}/v1/generate", {"prompt": "x" * 30000, "max_tokens": 3})
    assert s == 413


# ------------------------------------------------------------------------------ upstream down
@pytest.mark.parametrize("mode", ["passthrough", "passthrough-grpc", "transcode", "reencode", "http-proxy"])
def test_upstream_down_is_unavailable(tmp_path, mode: str) -> None:
    dead = f"127.0.0.1:{free_port()}"
    extra = ("--impl", "grpc") if mode == "passthrough-grpc" else ()
    gw = Gateway(tmp_path, mode.replace("-grpc", ""), dead, *extra)
    try:
        for _ in range(2):  # and again: it keeps serving
            if mode.startswith("passthrough") or mode == "reencode":
                with pytest.raises(grpc.RpcError) as err:
                    grpc_generate(gw.target, timeout=10, **REQ)
                assert err.value.code() is grpc.StatusCode.UNAVAILABLE
                assert dead in err.value.details(), err.value.details()
            else:
                status, _, body = http_post(f"{gw.url}/v1/generate", REQ)
                assert status == 503, body
                assert dead in json.loads(body)["error"]["message"]
        assert gw.popen.poll() is None
    finally:
        gw.stop()


def test_transcode_deadline_is_504(tmp_path, synthetic_server) -> None:
    gw = Gateway(tmp_path, "transcode", synthetic_server.grpc_target, "--timeout", "0.2")
    try:
        status, _, body = http_post(f"{gw.url}/v1/generate", {"prompt": "x", "max_tokens": 1000, "ignore_eos": True})
        assert status == 504 and json.loads(body)["error"]["status"] == "DEADLINE_EXCEEDED"
        status, _, _ = http_post(f"{gw.url}/v1/generate", REQ)
        assert status == 200
    finally:
        gw.stop()


# ------------------------------------------------------------------------------ no leaks
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["passthrough", "passthrough-grpc", "transcode", "reencode", "http-proxy"])
def test_no_leaks_after_failure_burst(tmp_path, synthetic_server, mode: str) -> None:
    grpc_in = mode.startswith("passthrough") or mode == "reencode"
    http_up = mode in ("reencode", "http-proxy")
    up = f"127.0.0.1:{synthetic_server.http_port}" if http_up else synthetic_server.grpc_target
    up_port = synthetic_server.http_port if http_up else synthetic_server.grpc_port
    extra = ("--impl", "grpc") if mode == "passthrough-grpc" else ()
    gw = Gateway(tmp_path, mode.replace("-grpc", ""), up, *extra)
    long_req = {"prompt": "x", "max_tokens": 1000, "ignore_eos": True}
    try:
        if grpc_in:
            with grpc.insecure_channel(gw.target) as ch:
                stub = llm_pb2_grpc.LLMStub(ch)
                for i in range(40):
                    with pytest.raises((grpc.RpcError, grpc.FutureCancelledError)):
                        if i % 4 == 0:
                            stub.Generate(llm_pb2.GenerateRequest(prompt="", max_tokens=3), timeout=5)
                        elif i % 4 == 1:
                            stub.Generate(llm_pb2.GenerateRequest(**long_req), timeout=0.05)
                        elif i % 4 == 2:
                            call = stub.GenerateStream(llm_pb2.GenerateRequest(**long_req), timeout=10)
                            next(call)
                            call.cancel()
                            next(call)
                        else:
                            fut = stub.Generate.future(llm_pb2.GenerateRequest(**long_req), timeout=10)
                            time.sleep(0.01)
                            fut.cancel()
                            fut.result()
                assert stub.Generate(llm_pb2.GenerateRequest(**REQ), timeout=10).text
        else:
            import http.client

            for i in range(40):
                conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
                if i % 2 == 0:
                    conn.request(
                        "POST",
                        "/v1/generate",
                        json.dumps({"prompt": "", "max_tokens": 3}),
                        {"Content-Type": "application/json"},
                    )
                    assert conn.getresponse().status == 400
                else:  # a stream the client walks away from
                    conn.request(
                        "POST",
                        "/v1/generate",
                        json.dumps({**long_req, "stream": True}),
                        {"Content-Type": "application/json"},
                    )
                    resp = conn.getresponse()
                    resp.fp.readline()
                conn.close()
            assert http_post(f"{gw.url}/v1/generate", REQ)[0] == 200
        assert wait_until(lambda: server_gauge(synthetic_server, "pathprobe_server_running") == 0, 15)
        assert wait_until(lambda: gw.outstanding() == 0, 15)
        # upstream connections: a keep-alive pool, not one per failed call
        assert established_to(gw.popen.pid, up_port) <= (4 if http_up else 2)
    finally:
        gw.stop()


# ------------------------------------------------------------------------------ sizes
@pytest.mark.parametrize("impl", ["h2", "grpc"])
def test_passthrough_body_limit_and_large_messages(tmp_path, synthetic_server, impl: str) -> None:
    gw = Gateway(tmp_path, "passthrough", synthetic_server.grpc_target, "--impl", impl, "--max-body-bytes", "200000")
    try:
        with grpc.insecure_channel(gw.target) as ch, grpc.insecure_channel(synthetic_server.grpc_target) as dch:
            stub, direct = llm_pb2_grpc.LLMStub(ch), llm_pb2_grpc.LLMStub(dch)
            with pytest.raises(grpc.RpcError) as err:
                stub.Generate(llm_pb2.GenerateRequest(prompt="x" * 300_000, max_tokens=3), timeout=10)
            assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            # the same connection keeps working (flow-control windows were given back)
            for _ in range(3):
                assert stub.Generate(llm_pb2.GenerateRequest(**REQ), timeout=10).text
            # large messages both ways, under the limit: byte-identical to the direct path
            big = llm_pb2.GenerateRequest(prompt="word " * 30_000, max_tokens=3)
            try:
                want = ("ok", direct.Generate(big, timeout=30))
            except grpc.RpcError as e:
                want = ("err", e.code(), e.details())
            try:
                got = ("ok", stub.Generate(big, timeout=30))
            except grpc.RpcError as e:
                got = ("err", e.code(), e.details())
            assert got == want
            long = llm_pb2.GenerateRequest(prompt="hi", max_tokens=2000, ignore_eos=True)

            def content(chunks):  # emit_ms is when the server sent each chunk: it differs between two calls
                return [(c.text, list(c.token_ids), c.finish_reason, c.usage) for c in chunks]

            assert content(stub.GenerateStream(long, timeout=60)) == content(direct.GenerateStream(long, timeout=60))
    finally:
        gw.stop()


# ------------------------------------------------------------------------------ streams: no double counting
@pytest.mark.parametrize("mode", ["transcode", "reencode"])
def test_stream_transcoding_is_not_counted_in_upstream(request, mode: str) -> None:
    """Per-chunk transcoding happens while the upstream call is open; it is the gateway's own time
    (gw.decode / gw.encode), and its waits for the client's transport that held the stream's end
    back are the client link's (gw.send), so gw.upstream leaves both out and the gateway's "other"
    (gw.total - gw.upstream - gw.decode - gw.encode - gw.send) is never negative, on every request,
    also with two streams at once."""
    from concurrent.futures import ThreadPoolExecutor

    gw = request.getfixturevalue(mode)
    req = {"prompt": "The capital of France is", "max_tokens": 24, "ignore_eos": True}

    def one(_: int) -> dict[str, float]:
        if mode == "reencode":
            chunks, entries = grpc_stream(gw.target, **req)
            assert len(chunks) >= 24
            return entries
        status, _, body = http_post(f"{gw.url}/v1/generate", {**req, "stream": True})
        assert status == 200
        events = sse_events(body)
        assert events[-1] == "[DONE]" and len(events) >= 25
        return timing.parse(events[-2]["server_timing"])

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, range(16)))
    for e in results:
        assert set(e) >= GW_ENTRIES | SRV_ENTRIES, e
        other = e["gw.total"] - e["gw.upstream"] - e["gw.decode"] - e["gw.encode"] - e["gw.send"]
        assert other >= -0.01, e
        assert e["gw.upstream"] > 0, e
        assert e["gw.decode"] > 0 and e["gw.encode"] > 0, e  # the chunks' work is still reported
        # the hand-offs that overlapped the upstream producing its next chunk stay in gw.upstream:
        # what the gateway saw of the upstream call, with the transcoding that ran under it, holds the
        # server's whole time (counting every hand-off as gw.send broke this by 8 ms on 32 chunks)
        seen = e["gw.upstream"] + e["gw.decode"] + e["gw.encode"]
        assert seen >= e["srv.total"] - e.get("srv.send", 0.0) - 0.05, e
