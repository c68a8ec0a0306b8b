"""Per-chunk timing on streams: the server's emit offsets against arrival, and a buffering proxy named.

The server stamps each streamed chunk with ``emit_ms``; the load generator keeps them per record and
compare's report splits inter-token gaps into decode and transport. nginx in front of the SSE route
with ``proxy_buffering on`` (its default, with its default HTTP/1.0 to the upstream) holds the small
events until its buffer fills or the response ends, so chunks emitted milliseconds apart arrive
together: flagged. With ``proxy_buffering off`` it relays each event as it comes: not flagged.
(nginx 1.22 with ``proxy_http_version 1.1`` passes a chunked upstream's events on as they come even
with buffering on: that configuration is not a buffering one, and is not flagged.)
Real processes: server, nginx, ``pathprobe load``.
"""

from __future__ import annotations

import itertools
import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pathprobe.analysis.report.chunks import chunk_timing, summarize

from tests.support.procs import Server, free_port

DECODE_MS = 3.0
TOKENS = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(
        tmp_path_factory.mktemp("chunks"),
        "--engine",
        "synthetic",
        "--prefill-ms-per-token",
        "0",
        "--decode-ms-per-token",
        str(DECODE_MS),
        "--max-batch-size",
        "4",
    )
    yield srv
    srv.stop()


def _load(url: str, out: Path, seconds: int = 2) -> list[dict]:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "load",
            "--headless",
            "-H",
            url,
            "--stream",
            "-u",
            "1",
            "-r",
            "1",
            "-t",
            f"{seconds}s",
            "--out",
            str(out),
            "--max-tokens",
            str(TOKENS),
            "--tokenizer",
            "none",
            "--only-summary",
            "--loglevel",
            "WARNING",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    ok = [r for r in recs if r["ok"]]
    assert len(ok) >= 5, recs[:2]
    return ok


@pytest.mark.parametrize("url_of", ["grpc", "http"])
def test_server_stamps_every_chunk_and_gaps_split_into_decode_and_transport(server, tmp_path, url_of):
    url = f"grpc://{server.grpc_target}" if url_of == "grpc" else server.http_url
    ok = _load(url, tmp_path / url_of)
    for r in ok:
        assert r["emit_ms"] is not None and len(r["emit_ms"]) == TOKENS
        assert all(b > a for a, b in zip(r["emit_ms"], r["emit_ms"][1:]))  # emitted in order, apart
        assert chunk_timing(r) is not None
    s = summarize(ok)
    # a single stream can look coalesced when the load generator itself was late reading it; the
    # configuration is only named when most of its streams are
    assert s["buffered_share"] < 0.2, s
    # the engine's gap is the decode gap; a direct loopback path adds (almost) nothing to it
    assert abs(s["decode_gap_p50_ms"] - DECODE_MS) < 1.0, s
    assert abs(s["transport_gap_p50_ms"]) < 0.5, s
    assert not s["buffering"]


def _nginx(prefix: Path, port: int, upstream: str, buffering: bool) -> subprocess.Popen:
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    conf = prefix / "nginx.conf"
    conf.write_text(f"""worker_processes 1;
pid {prefix}/nginx.pid;
{"user root;" if hasattr(__import__("os"), "geteuid") and __import__("os").geteuid() == 0 else ""}
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {prefix}/tmp/body; proxy_temp_path {prefix}/tmp/proxy;
  fastcgi_temp_path {prefix}/tmp/fastcgi; uwsgi_temp_path {prefix}/tmp/uwsgi; scgi_temp_path {prefix}/tmp/scgi;
  upstream llm {{ server {upstream}; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://llm;
      proxy_buffering {"on" if buffering else "off"};
    }}
  }}
}}
""")
    proc = subprocess.Popen(
        ["nginx", "-p", str(prefix), "-e", str(prefix / "error.log"), "-c", str(conf), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise TimeoutError("nginx did not listen")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
@pytest.mark.parametrize("buffering", [True, False])
def test_nginx_proxy_buffering_on_sse_is_flagged_and_off_is_not(server, tmp_path, buffering):
    port = free_port()
    proc = _nginx(tmp_path / "ngx", port, server.http_url.split("://", 1)[1], buffering)
    try:
        ok = _load(f"http://127.0.0.1:{port}", tmp_path / "load")
    finally:
        proc.terminate()
        proc.wait(10)
    s = summarize(ok)
    assert s["buffering"] is buffering, s
    if buffering:
        assert s["buffered_share"] > 0.9 and s["delay_spread_p50_ms"] > 0.5 * DECODE_MS * (TOKENS - 2), s
    else:
        assert s["buffered_share"] < 0.1, s


def _stream(emit: list[float], arrival: list[float], wait: float = 0.0) -> dict:
    return {
        "ok": True,
        "emit_ms": emit,
        "ttft_ms": arrival[0],
        "itl_ms": [b - a for a, b in itertools.pairwise(arrival)],
        "client_wait_total_ms": wait,
    }


def test_held_back_chunks_are_buffering_unless_the_client_itself_was_waiting():
    emit = [1.0 + 3 * i for i in range(8)]  # emitted 3 ms apart
    together = [30.0 + 0.01 * i for i in range(8)]  # all arrive at the end
    assert chunk_timing(_stream(emit, together))["buffered"]
    # the same arrival, but the load generator's loop was busy for 25 ms meanwhile: its own doing
    assert not chunk_timing(_stream(emit, together, wait=25.0))["buffered"]
    # relayed as emitted (1 ms later each): nothing held
    c = chunk_timing(_stream(emit, [e + 1.0 for e in emit]))
    assert not c["buffered"] and all(abs(g - 3.0) < 1e-9 for g in c["decode_gaps"])
    assert all(abs(g) < 1e-9 for g in c["transport_gaps"])
