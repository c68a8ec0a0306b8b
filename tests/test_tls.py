"""TLS and mTLS end to end: server (gRPC + HTTPS), every gateway mode on both sides, and the
load generator's grpcs:// / https:// / openai+https:// targets. The tests make their own CA."""

from __future__ import annotations

import json
import ssl
import sys
import urllib.error
import urllib.request

import grpc
import pytest
from pathprobe import timing
from pathprobe.pki import make_pki
from pathprobe.tls import TlsFiles, grpc_channel
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

from tests.support.procs import Server

REQ = {"prompt": "The capital of France is", "max_tokens": 4}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def client_tls(pki) -> TlsFiles:
    return TlsFiles(str(pki.client_cert), str(pki.client_key), str(pki.ca))


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory, pki, client_tls):
    srv = Server(
        tmp_path_factory.mktemp("tls-srv"),
        "--engine",
        "synthetic",
        "--decode-ms-per-token",
        "1",
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        "--tls-ca",
        str(pki.ca),
        client_tls=client_tls,
    )
    yield srv
    srv.stop()


def grpc_call(target: str, tls: TlsFiles | None, stream: bool = False, metadata=()):
    with grpc_channel(target, tls) as ch:
        stub = llm_pb2_grpc.LLMStub(ch)
        if stream:
            call = stub.GenerateStream(llm_pb2.GenerateRequest(**REQ), timeout=10, metadata=metadata)
            chunks = list(call)
            return chunks, timing.from_metadata(call.trailing_metadata())
        resp, call = stub.Generate.with_call(llm_pb2.GenerateRequest(**REQ), timeout=10, metadata=metadata)
        return resp, timing.from_metadata(call.trailing_metadata())


def https_post(url: str, tls: TlsFiles | None, body: dict, headers: dict | None = None):
    ctx = tls.client_context() if tls is not None else ssl.create_default_context()
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


# ------------------------------------------------------------------------------ server
def test_server_mtls_both_ports(mtls_server, client_tls, pki) -> None:
    resp, entries = grpc_call(mtls_server.grpc_target, client_tls)
    assert resp.usage.completion_tokens == 4 and entries["srv.total"] > 0
    status, headers, body = https_post(f"{mtls_server.http_url}/v1/generate", client_tls, REQ)
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4
    assert "srv.total" in timing.parse(headers["Server-Timing"])
    # no client certificate: the handshake is refused on both ports
    no_cert = TlsFiles(ca=str(pki.ca))
    with pytest.raises(grpc.RpcError) as ei:
        grpc_call(mtls_server.grpc_target, no_cert)
    assert ei.value.code() is grpc.StatusCode.UNAVAILABLE
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        https_post(f"{mtls_server.http_url}/v1/generate", no_cert, REQ)
    # a client that does not trust the CA refuses the server
    with pytest.raises(grpc.RpcError):
        grpc_call(mtls_server.grpc_target, TlsFiles(str(pki.client_cert), str(pki.client_key)))
    # plaintext at a TLS port gets nothing
    with pytest.raises(grpc.RpcError):
        grpc_call(mtls_server.grpc_target, None)
    # still serving after the failed handshakes
    assert grpc_call(mtls_server.grpc_target, client_tls)[0].usage.completion_tokens == 4


# ------------------------------------------------------------------------------ gateways
GATEWAYS = [
    ("passthrough", ("--impl", "h2")),
    ("passthrough", ("--impl", "grpc")),
    ("transcode", ()),
    ("reencode", ()),
    ("http-proxy", ()),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode, extra", GATEWAYS, ids=["passthrough-h2", "passthrough-grpc", "transcode", "reencode", "http-proxy"]
)
def test_gateway_mtls_both_sides(tmp_path, mtls_server, pki, client_tls, mode, extra) -> None:
    from tests.test_gateway import Gateway

    http_up = mode in ("reencode", "http-proxy")
    upstream = f"127.0.0.1:{mtls_server.http_port}" if http_up else mtls_server.grpc_target
    gw = Gateway(
        tmp_path,
        mode,
        upstream,
        *extra,
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        "--tls-ca",
        str(pki.ca),
        "--upstream-ca",
        str(pki.ca),
        "--upstream-cert",
        str(pki.client_cert),
        "--upstream-key",
        str(pki.client_key),
    )
    try:
        if mode == "transcode" or mode == "http-proxy":
            url = f"https://127.0.0.1:{gw.port}/v1/generate"
            for stream in (False, True):
                status, headers, body = https_post(url, client_tls, {**REQ, "stream": stream})
                assert status == 200, body
                if stream:
                    last = [json.loads(x[6:]) for x in body.decode().split("\n\n") if x.startswith("data: {")][-1]
                    entries = timing.parse(last["server_timing"])
                else:
                    entries = timing.parse(headers["Server-Timing"])
                assert entries["srv.total"] > 0 and entries["gw.total"] >= entries["gw.upstream"] > 0
            # a client without a certificate is refused by the gateway's listener
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                https_post(url, TlsFiles(ca=str(pki.ca)), REQ)
        else:
            for stream in (False, True):
                _, entries = grpc_call(gw.target, client_tls, stream)
                assert entries["srv.total"] > 0 and entries["gw.total"] >= entries["gw.upstream"] > 0
            with pytest.raises(grpc.RpcError):
                grpc_call(gw.target, TlsFiles(ca=str(pki.ca)))
        # the health checker reached the upstream over mTLS (it would be marked down otherwise)
        healthy = [v for k, v in gw.metrics().items() if k.startswith("pathprobe_gateway_upstream_healthy")]
        assert healthy == [1.0]
    finally:
        gw.stop()
    assert gw.popen.returncode == 0, gw.log()


@pytest.mark.slow
def test_gateway_without_upstream_ca_fails_closed(tmp_path, mtls_server, pki, client_tls) -> None:
    """An upstream certificate the gateway cannot verify is UNAVAILABLE, never accepted."""
    from tests.test_gateway import Gateway

    gw = Gateway(tmp_path, "passthrough", mtls_server.grpc_target, "--upstream-tls", "--health-interval", "0")
    try:
        with pytest.raises(grpc.RpcError) as ei:
            grpc_call(gw.target, None)
        assert ei.value.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        gw.stop()


# ------------------------------------------------------------------------------ load generator
@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["grpcs", "https", "openai+https"])
def test_load_over_tls(tmp_path, mtls_server, pki, scheme) -> None:
    from tests.test_load_e2e import run_load

    port = mtls_server.grpc_port if scheme == "grpcs" else mtls_server.http_port
    out = tmp_path / "out"
    run_load(
        out,
        "-H",
        f"{scheme}://127.0.0.1:{port}",
        "-u",
        "2",
        "-r",
        "100",
        "-t",
        "2s",
        "--max-tokens",
        "4",
        "--target-ca",
        str(pki.ca),
        "--target-cert",
        str(pki.client_cert),
        "--target-key",
        str(pki.client_key),
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"]["requests"] > 0 and summary["totals"]["errors"] == 0, summary["totals"]
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines() if x]
    if scheme != "openai+https":
        assert all(r["entries"].get("srv.total", 0) > 0 for r in recs if r["ok"])


def test_tls_files_errors(tmp_path) -> None:
    from pathprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="--tls-cert/--tls-key"):
        TlsFiles(cert=str(tmp_path / "x"))
    with pytest.raises(ConfigError, match="--upstream-ca: no such file"):
        TlsFiles(ca=str(tmp_path / "missing.pem"), flag="--upstream")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# ------------------------------------------------------------------------------ compare
@pytest.mark.slow
def test_compare_runs_a_configuration_over_tls(tmp_path) -> None:
    """The same gateway in plaintext and over TLS side by side; the handshake is measured apart."""
    import subprocess

    cfg = tmp_path / "tls.yaml"
    cfg.write_text("""
mode: local
tracing: false
server: {engine: synthetic, decode_ms_per_token: 0.5}
load: {duration_s: 1, warmup_s: 0.5, rounds: 1, concurrency: [2], max_tokens: 4}
targets:
  - {name: passthrough, kind: gateway, mode: passthrough}
  - {name: passthrough-tls, kind: gateway, mode: passthrough, tls: true}
  - {name: transcode-tls, kind: gateway, mode: transcode, tls: true}
  - {name: direct, kind: direct, protocol: http}
""")
    out = tmp_path / "out"
    res = subprocess.run(
        [sys.executable, "-m", "pathprobe", "compare", str(cfg), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    for name, scheme in (
        ("passthrough", "grpc://"),
        ("passthrough-tls", "grpcs://"),
        ("transcode-tls", "https://"),
        ("direct", "http://"),
    ):
        t = report["targets"][name]
        assert t["status"] == "ok" and t["url"].startswith(scheme), t
        g = t["by_concurrency"]["2"]
        assert g["ok"] > 0 and g["errors"] == 0
        # accounting: the server (and the gateway) counted every request the client sent, by status
        acct = g["accounting"]
        assert acct["lost"] == 0 and acct["unexplained"] == 0, acct
        sent = acct["client"]["OK"]
        assert acct["server"]["OK"] >= sent and ("gateway" in acct) == (name != "direct")
        hs = t["tls_handshake"]
        if name in ("passthrough", "direct"):
            assert hs is None
        else:
            assert hs["tcp_plus_tls_ms"] > hs["tcp_connect_ms"] > 0 and hs["n"] == 20


def test_fastapi_front_end_tls_and_key(tmp_path, pki, client_tls) -> None:
    """The FastAPI front end gets the same TLS (mTLS) and the same key check as aiohttp."""
    srv = Server(
        tmp_path,
        "--engine",
        "synthetic",
        "--http-server",
        "fastapi",
        "--api-key",
        "k1",
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        "--tls-ca",
        str(pki.ca),
        client_tls=client_tls,
    )
    try:
        url = f"{srv.http_url}/v1/generate"
        status, _, body = https_post(url, client_tls, REQ)
        assert status == 401 and json.loads(body)["error"]["status"] == "UNAUTHENTICATED"
        status, headers, body = https_post(url, client_tls, REQ, {"Authorization": "Bearer k1"})
        assert status == 200 and "srv.total" in timing.parse(headers["server-timing"])
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            https_post(url, TlsFiles(ca=str(pki.ca)), REQ, {"Authorization": "Bearer k1"})
    finally:
        srv.stop()
