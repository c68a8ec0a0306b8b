"""pathprobe's HTTP/2 gRPC client gives the same records as grpcio's, against the same servers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from pathprobe.loadgen.call import Outcome
from pathprobe.loadgen.h2grpc import Channel, _timeout
from pathprobe.loadgen.targets import CallSpec, GrpcTarget, H2GrpcTarget, make_target

from tests.support.procs import Proc, Server, free_port, wait_grpc

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gateway(synthetic_server, tmp_path_factory) -> Iterator[str]:
    """The passthrough relay in front of the server: its trailers carry a second server-timing."""
    port = free_port()
    gw = Proc(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "gateway",
            "--mode",
            "passthrough",
            "--listen",
            f"127.0.0.1:{port}",
            "--upstream",
            synthetic_server.grpc_target,
        ],
        tmp_path_factory.mktemp("gw") / "gw.log",
    )
    wait_grpc(f"127.0.0.1:{port}", 60, gw.popen)
    yield f"127.0.0.1:{port}"
    gw.stop()


def records(address: str, specs: list[CallSpec], timeout_s: float = 30.0) -> list[tuple[dict, dict]]:
    """(grpcio record, h2 record) per spec, both made under gevent in a load-generator-like process."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.grpc_clients", address, str(timeout_s)],
        input=json.dumps([asdict(s) for s in specs]),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [(r["grpcio"], r["h2"]) for r in json.loads(proc.stdout)]


def same(a: dict, b: dict) -> None:
    """Equal outcomes: everything but the measured durations (which differ call to call)."""
    for key in ("route", "ok", "status", "error", "tokens_in", "tokens_out"):
        assert a[key] == b[key], key
    assert sorted(a["entries"]) == sorted(b["entries"])

    def hops(rec: dict) -> list:
        return [(h["kind"], sorted(h["entries"])) for h in rec["hops"] or []]

    assert hops(a) == hops(b)  # hop by hop, in order (server, then gateway)
    assert len(a["itl_ms"]) == len(b["itl_ms"])  # one arrival time per stream chunk with tokens
    assert (a["split"] is None) == (b["split"] is None)
    if a["split"] is not None:
        assert sorted(a["split"]) == sorted(b["split"])
    for rec in (a, b):  # timing entries present and sane on both sides
        assert rec["e2e_ms"] > 0 and rec["client_encode_ms"] > 0
        if rec["ok"]:
            # measured: what the split counts (on a stream only the decode that held the end back, which
            # can be 0) plus what overlapped the path's own time
            assert rec["client_decode_ms"] >= 0 and rec["client_decode_ms"] + rec["client_decode_overlap_ms"] > 0
            assert all(v >= 0 for v in rec["entries"].values())


@pytest.mark.slow
@pytest.mark.parametrize("via", ["server", "gateway"])
def test_same_records_unary_and_stream(synthetic_server, gateway, via: str) -> None:
    address = synthetic_server.grpc_target if via == "server" else gateway
    # repeated calls: the later ones exercise the indexed (HPACK table) forms
    specs = [
        CallSpec(prompt="The capital of France is", max_tokens=6, stream=stream, request_id=f"r{i}")
        for i in range(3)
        for stream in (False, True)
    ]
    for (a, b), spec in zip(records(address, specs), specs):
        same(a, b)
        assert b["ok"] and b["tokens_out"] == 6
        assert {"srv.total", "srv.prefill"} <= set(b["entries"])
        if via == "gateway":  # the server's and the gateway's server-timing, both read
            assert {"gw.total", "gw.upstream"} <= set(b["entries"])
        if spec.stream:
            assert len(b["itl_ms"]) == 5


@pytest.mark.slow
def test_same_records_for_errors(synthetic_server) -> None:
    specs = [
        CallSpec(prompt="x", max_tokens=4, stream=False, model="no-such-model"),
        CallSpec(prompt="x", max_tokens=4, stream=True, model="no-such-model"),
        CallSpec(prompt="still usable after an error", max_tokens=2, stream=False),
    ]
    got = records(synthetic_server.grpc_target, specs)
    for a, b in got:
        same(a, b)
    assert got[0][1]["status"] == "INVALID_ARGUMENT" and "no-such-model" in got[0][1]["error"]
    assert got[2][1]["ok"]
    ((a, b),) = records(f"127.0.0.1:{free_port()}", specs[2:], 5)  # nothing listens there
    assert a["status"] == b["status"] == "UNAVAILABLE"


@pytest.mark.slow
def test_deadline_and_large_request(tmp_path) -> None:
    slow = Server(tmp_path, "--engine", "synthetic", "--decode-ms-per-token", "50", "--prefill-ms-per-token", "0")
    try:
        ((a, b),) = records(slow.grpc_target, [CallSpec(prompt="slow", max_tokens=40, stream=False)], 0.3)
        assert a["status"] == b["status"] == "DEADLINE_EXCEEDED"
        assert 250 < b["e2e_ms"] < 2000
        # after a deadline the connection still works; then a request over the 64 KiB default
        # flow-control window, sent in steps as the server opens the window (over the context
        # length: the answer says how many tokens arrived)
        specs = [
            CallSpec(prompt="slow", max_tokens=40, stream=False),
            CallSpec(prompt="after a deadline", max_tokens=1, stream=False),
            CallSpec(prompt="word " * 40_000, max_tokens=1, stream=False),
        ]
        got = records(slow.grpc_target, specs, 0.3)
        assert [r[1]["status"] for r in got[:1]] == ["DEADLINE_EXCEEDED"]
        got = records(slow.grpc_target, specs[1:], 30)
        for a, b in got:
            same(a, b)
        # the whole 200 kB prompt arrived (the server counted its tokens before refusing its length)
        assert got[1][1]["status"] == "INVALID_ARGUMENT" and "(80003 tokens)" in got[1][1]["error"]
    finally:
        slow.stop()


@pytest.mark.slow
def test_metadata_reaches_the_server_and_reconnects(synthetic_server) -> None:
    ch = Channel(synthetic_server.grpc_target)
    got: list[bytes] = []
    from pathprobe.v1 import llm_pb2

    req = llm_pb2.GenerateRequest(prompt="hi", max_tokens=1).SerializeToString()
    res = ch.call(
        "/pathprobe.v1.LLM/Generate",
        req,
        10,
        [("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01")],
        lambda m, _t: got.append(m),
    )
    assert res.code == 0 and len(got) == 1 and res.server_timing
    ch.close()  # the next call opens a new connection by itself
    res = ch.call("/pathprobe.v1.LLM/Nope", req, 10, None, lambda m, _t: None)
    assert res.status == "UNIMPLEMENTED"
    ch.close()


def test_grpc_timeout_header_and_client_choice() -> None:
    assert _timeout(60) == b"60000000u"
    assert _timeout(1e6) == b"1000000S"
    assert _timeout(1e9) == b"16666666M"
    assert _timeout(0.0) == b"1u"
    assert isinstance(make_target("grpc://127.0.0.1:1"), H2GrpcTarget)
    assert isinstance(make_target("grpc://127.0.0.1:1", grpc_client="grpcio"), GrpcTarget)
    from pathprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="grpc-client"):
        make_target("grpc://127.0.0.1:1", grpc_client="nope")


def test_every_token_chunk_carries_when_its_bytes_arrived(synthetic_server) -> None:
    # the kernel's receive stamp of the read each message came in (pathprobe.rxstamp): the
    # split takes a stream's last chunk's arrival from it, and the client's wait is capped by its age
    target = H2GrpcTarget(synthetic_server.grpc_target, 30.0)
    try:
        for stream in (True, False):
            out = Outcome()
            spec = CallSpec(prompt="The capital of France is", max_tokens=6, stream=stream, request_id="rx")
            target.call(spec, {}, out)
            assert out.ok, out.error
            age = target.read_age_ms()
            assert age is not None and 0.0 <= age < 1000.0
            if stream:
                assert len(out.token_rx) == len(out.token_times) == 6
                assert all(0 <= seen - rx < 1e9 for rx, seen in zip(out.token_rx, out.token_times, strict=True))
                assert out.token_rx == sorted(out.token_rx)
    finally:
        target.close()
