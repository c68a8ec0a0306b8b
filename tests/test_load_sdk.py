"""`pathprobe load -H openai-sdk+http://`: the official openai SDK as the client, split honestly.

Against one synthetic server, the SDK target and the raw OpenAI target must agree on what
the server did, and what the SDK adds must show as client serialization (its request
building and typed parsing), not as network or server time.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from pathprobe.segments import SEGMENTS

from tests.support.procs import Server

pytestmark = pytest.mark.slow
pytest.importorskip("openai")


def _load(tmp: Path, host: str, stream: bool) -> list[dict]:
    out = tmp / f"load-{host.split(':')[0]}-{stream}"
    args = [
        sys.executable,
        "-m",
        "pathprobe",
        "load",
        "--headless",
        "-H",
        host,
        "-u",
        "1",
        "-r",
        "1",
        "-t",
        "4s",
        "--max-tokens",
        "6",
        "--out",
        str(out),
        "--only-summary",
        "--loglevel",
        "WARNING",
    ]
    if stream:
        args.append("--stream")
    res = subprocess.run(args, capture_output=True, text=True, timeout=180)
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    ok = [r for r in recs if r["ok"]]
    assert len(ok) >= 10, res.stdout[-2000:] + res.stderr[-2000:]
    return ok


def _med(recs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in recs)


@pytest.mark.parametrize("stream", [False, True])
def test_sdk_target_books_the_sdk_as_client_serialization(tmp_path: Path, stream: bool) -> None:
    srv = Server(tmp_path, "--engine", "synthetic", "--decode-ms-per-token", "1")
    try:
        raw = _load(tmp_path, f"openai+{srv.http_url}", stream)
        sdk = _load(tmp_path, f"openai-sdk+{srv.http_url}", stream)
    finally:
        srv.stop()
    for r in sdk:
        assert r["route"].startswith("openai-sdk.completions")
        assert r["tokens_out"] == 6 and r["entries"]["srv.total"] > 0
        assert sum(r["split"][s] for s in SEGMENTS) == pytest.approx(r["e2e_ms"], abs=1e-6)
        assert r["client_encode_ms"] > 0 and r["client_decode_ms"] >= 0  # a stream's: what held its end back
        assert r["client_decode_ms"] + r["client_decode_overlap_ms"] > 0
        if stream:
            assert len(r["itl_ms"]) == 5 and r["ttft_ms"] < r["e2e_ms"]
    # the server did the same work for both clients
    assert _med(sdk, "e2e_ms") > _med(raw, "e2e_ms")
    srv_sdk = statistics.median(r["entries"]["srv.total"] for r in sdk)
    srv_raw = statistics.median(r["entries"]["srv.total"] for r in raw)
    assert abs(srv_sdk - srv_raw) < max(0.3 * srv_raw, 2.0), (srv_sdk, srv_raw)
    # what the SDK adds is client serialization: request building and typed parsing
    ser_sdk = _med(sdk, "client_encode_ms") + _med(sdk, "client_decode_ms")
    ser_raw = _med(raw, "client_encode_ms") + _med(raw, "client_decode_ms")
    assert ser_sdk > ser_raw + 0.1, (ser_sdk, ser_raw)
