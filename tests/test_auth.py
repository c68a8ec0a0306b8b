"""API keys on the server and every gateway mode: missing/wrong -> 401 / UNAUTHENTICATED,
right -> served; the gateway forwards the client's credential or replaces it; the load
generator sends one (--api-key / PATHPROBE_API_KEY)."""

from __future__ import annotations

import json
import urllib.request

import grpc
import pytest
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

from tests.support.clients import http_post
from tests.support.procs import Server

SERVER_KEY = "srv-key-0123456789"
GATEWAY_KEY = "gw-key-abcdef"
REQ = {"prompt": "The capital of France is", "max_tokens": 3}


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    srv = Server(
        tmp_path_factory.mktemp("auth-srv"),
        "--engine",
        "synthetic",
        "--decode-ms-per-token",
        "1",
        "--api-key",
        f"old-key,{SERVER_KEY}",
    )
    yield srv
    srv.stop()


def grpc_code(ch: grpc.Channel, metadata=(), stream: bool = False) -> grpc.StatusCode:
    stub = llm_pb2_grpc.LLMStub(ch)
    try:
        if stream:
            list(stub.GenerateStream(llm_pb2.GenerateRequest(**REQ), metadata=metadata, timeout=10))
        else:
            stub.Generate(llm_pb2.GenerateRequest(**REQ), metadata=metadata, timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def bearer(key: str) -> tuple:
    return (("authorization", f"Bearer {key}"),)


def test_server_keys(keyed_server) -> None:
    with grpc.insecure_channel(keyed_server.grpc_target) as ch:
        for stream in (False, True):
            assert grpc_code(ch, (), stream) is grpc.StatusCode.UNAUTHENTICATED
            assert grpc_code(ch, bearer("nope"), stream) is grpc.StatusCode.UNAUTHENTICATED
            assert grpc_code(ch, bearer(SERVER_KEY), stream) is grpc.StatusCode.OK
            assert grpc_code(ch, bearer("old-key"), stream) is grpc.StatusCode.OK  # rotation: both accepted
            assert grpc_code(ch, (("x-api-key", SERVER_KEY),), stream) is grpc.StatusCode.OK
    url = f"{keyed_server.http_url}/v1/generate"
    status, headers, body = http_post(url, REQ)
    err = json.loads(body)["error"]
    assert status == 401 and err["status"] == "UNAUTHENTICATED" and headers["WWW-Authenticate"] == "Bearer"
    assert SERVER_KEY not in body.decode()
    assert http_post(url, REQ, {"Authorization": "Bearer wrong"})[0] == 401
    assert http_post(url, REQ, {"Authorization": f"Basic {SERVER_KEY}"})[0] == 401
    assert http_post(url, REQ, {"Authorization": f"Bearer {SERVER_KEY}"})[0] == 200
    assert (
        http_post(f"{keyed_server.http_url}/v1/completions", {**REQ, "model": "synthetic"}, {"X-API-Key": SERVER_KEY})[
            0
        ]
        == 200
    )
    # probes and scrapers need no key; refusals are counted
    with urllib.request.urlopen(f"{keyed_server.http_url}/healthz", timeout=5) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"{keyed_server.http_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'pathprobe_server_requests_total{code="401",route="http.auth"}' in text
    assert 'code="UNAUTHENTICATED",route="grpc.Generate"' in text


MODES = [
    ("passthrough", ("--impl", "h2")),
    ("passthrough", ("--impl", "grpc")),
    ("transcode", ()),
    ("reencode", ()),
    ("http-proxy", ()),
]


def _call(gw, mode: str, key: str | None, stream: bool = False):
    """grpc status name or HTTP status code as a string."""
    if mode in ("transcode", "http-proxy"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        status, _, body = http_post(f"{gw.url}/v1/generate", {**REQ, "stream": stream}, headers)
        if status == 200 and stream:
            assert b'"error"' not in body, body
        return str(status)
    with grpc.insecure_channel(gw.target) as ch:
        return grpc_code(ch, bearer(key) if key else (), stream).name


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, extra", MODES, ids=["passthrough-h2", "passthrough-grpc", "transcode", "reencode", "http-proxy"]
)
def test_gateway_checks_replaces_and_forwards(tmp_path, keyed_server, mode, extra) -> None:
    from tests.test_gateway import Gateway

    up = f"127.0.0.1:{keyed_server.http_port}" if mode in ("reencode", "http-proxy") else keyed_server.grpc_target
    ok, denied = ("200", "401") if mode in ("transcode", "http-proxy") else ("OK", "UNAUTHENTICATED")
    # 1. the gateway checks its own key and sends the server's in its place
    gw = Gateway(tmp_path, mode, up, *extra, "--api-key", GATEWAY_KEY, "--upstream-api-key", SERVER_KEY)
    try:
        for stream in (False, True):
            assert _call(gw, mode, None, stream) == denied
            assert _call(gw, mode, "wrong", stream) == denied
            assert _call(gw, mode, GATEWAY_KEY, stream) == ok
            assert _call(gw, mode, SERVER_KEY, stream) == denied  # the server's key is not the gateway's
        if mode == "passthrough":
            # refused and admitted calls interleaved on ONE connection: the connection survives refusals
            with grpc.insecure_channel(gw.target) as ch:
                codes = [grpc_code(ch, bearer(GATEWAY_KEY if i % 2 else "bad"), bool(i % 3)) for i in range(12)]
            assert codes == [grpc.StatusCode.OK if i % 2 else grpc.StatusCode.UNAUTHENTICATED for i in range(12)]
        m = gw.metrics()
        assert (
            sum(
                v
                for k, v in m.items()
                if k.startswith("pathprobe_gateway_requests_total") and (f'code="{denied}"' in k)
            )
            >= 6
        )
    finally:
        gw.stop()
    # 2. no key at the gateway: the client's credential goes upstream unchanged
    gw = Gateway(tmp_path, mode, up, *extra)
    try:
        assert _call(gw, mode, SERVER_KEY) == ok
        assert _call(gw, mode, None) == denied  # the server's answer, relayed
    finally:
        gw.stop()


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_load_generator_sends_the_key(tmp_path, keyed_server, scheme) -> None:
    from tests.test_load_e2e import run_load

    host = f"grpc://{keyed_server.grpc_target}" if scheme == "grpc" else keyed_server.http_url
    common = ("-H", host, "-u", "2", "-r", "100", "-t", "1s", "--max-tokens", "3")
    run_load(tmp_path / "flag", *common, "--api-key", SERVER_KEY)
    run_load(tmp_path / "env", *common, env={"PATHPROBE_API_KEY": SERVER_KEY})
    run_load(tmp_path / "none", *common)
    for name, errors in (("flag", False), ("env", False), ("none", True)):
        totals = json.loads((tmp_path / name / "summary.json").read_text())["totals"]
        assert totals["requests"] > 0
        if errors:
            assert totals["ok"] == 0 and totals["errors"] > 0, (name, totals)
            recs = [json.loads(x) for x in (tmp_path / name / "records.jsonl").read_text().splitlines() if x]
            assert {r["status"] for r in recs if r["status"] != "STOPPED"} == {
                "UNAUTHENTICATED" if scheme == "grpc" else "401"
            }
        else:
            assert totals["errors"] == 0, (name, totals)
