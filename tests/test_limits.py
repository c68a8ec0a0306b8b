"""Size limits: a request over a limit gets 413 (HTTP) / RESOURCE_EXHAUSTED (gRPC) with the limit named,
never a hang or a bare reset, and the process keeps serving; compare derives every limit from the sweep's
largest payload in one place (pathprobe.analysis.lab.limits)."""

from __future__ import annotations

import json

import grpc
import pytest
from pathprobe.analysis.lab import limits
from pathprobe.analysis.lab.config import parse_config
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

from tests.support.clients import http_post
from tests.support.procs import Server
from tests.test_gateway import Gateway

LIMIT = 100_000
OK = {"prompt": "ok", "max_tokens": 2, "ignore_eos": True}


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    srv = Server(tmp, "--engine", "synthetic", "--max-body-bytes", str(LIMIT), "--max-context", "200000")
    gws = {
        mode: Gateway(tmp, mode, srv.grpc_target, "--max-body-bytes", str(LIMIT))
        for mode in ("passthrough", "transcode")
    }
    yield srv, gws
    for gw in gws.values():
        gw.stop()
    srv.stop()


def _grpc_refused(target: str) -> None:
    """Over the limit: RESOURCE_EXHAUSTED naming it; then the same channel still serves."""
    with grpc.insecure_channel(target) as ch:
        stub = llm_pb2_grpc.LLMStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(llm_pb2.GenerateRequest(prompt="x" * (LIMIT + 10), max_tokens=2), timeout=20)
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
        details = err.value.details() or ""
        assert str(LIMIT) in details and "--max-body-bytes" in details, details
        for _ in range(3):
            assert stub.Generate(llm_pb2.GenerateRequest(**OK), timeout=20).usage.completion_tokens == 2
        # just under the limit still goes through
        under = llm_pb2.GenerateRequest(prompt="y " * ((LIMIT - 200) // 2), max_tokens=2)
        assert stub.Generate(under, timeout=20).usage.completion_tokens == 2


def _http_refused(url: str) -> None:
    status, _, body = http_post(url + "/v1/generate", {"prompt": "x" * (LIMIT + 10), "max_tokens": 2})
    assert status == 413, (status, body)
    err = json.loads(body)["error"]
    assert err["status"] == "RESOURCE_EXHAUSTED" and str(LIMIT) in err["message"], err
    assert "--max-body-bytes" in err["message"], err
    assert http_post(url + "/v1/generate", OK)[0] == 200


def test_server_grpc_names_its_limit_and_keeps_serving(limited):
    srv, _ = limited
    _grpc_refused(srv.grpc_target)


def test_server_http_names_its_limit_and_keeps_serving(limited):
    srv, _ = limited
    _http_refused(srv.http_url)


def test_passthrough_gateway_names_its_limit_and_keeps_serving(limited):
    _, gws = limited
    _grpc_refused(gws["passthrough"].target)


def test_transcode_gateway_names_its_limit_and_keeps_serving(limited):
    _, gws = limited
    _http_refused(gws["transcode"].url)


def test_limits_follow_the_largest_payload(tmp_path):
    """One place sizes every limit: the body from the largest prompt's measured bytes, the synthetic
    server's context from the largest prompt + max_tokens; a small sweep keeps the defaults."""
    cfg = parse_config(
        {"server": {"engine": "synthetic"}, "load": {"prompt_tokens": [64, 131072], "max_tokens": [16, 2048]}}
    )
    assert [p.key for p in cfg.load.payloads][:2] == ["p64-m16", "p64-m2048"] and cfg.load.swept
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "word " * 131072}) + "\n")
    got = limits.derive(cfg, [prompts])
    assert got.measured and got.largest_prompt_bytes == 5 * 131072
    assert got.body_bytes >= limits.JSON_EXPANSION * 5 * 131072
    assert got.context_tokens is not None and got.context_tokens >= 131072 + 2048
    rows = {(r["where"], r["setting"].split()[0]) for r in got.rows(cfg)}
    assert {("server", "--max-body-bytes"), ("gateway", "--max-body-bytes"), ("nginx", "client_max_body_size")} <= rows
    small = limits.derive(parse_config({}), None)
    assert small.body_bytes == 4 * 1024 * 1024 and small.context_tokens is None
