"""The gateway in front of the real transformers engine (tiny model): same answers as direct."""

from __future__ import annotations

import json

import pytest
from pathprobe import timing

from tests.support.clients import grpc_generate, grpc_stream, http_post, sse_events
from tests.test_gateway import Gateway, check_entries, strip_timing

REQ = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.0}


@pytest.mark.slow
def test_tiny_engine_through_passthrough_and_transcode(tmp_path, tiny_server) -> None:
    gws = [
        Gateway(tmp_path, "passthrough", tiny_server.grpc_target),
        Gateway(tmp_path, "transcode", tiny_server.grpc_target),
        Gateway(tmp_path, "reencode", f"127.0.0.1:{tiny_server.http_port}"),
        Gateway(tmp_path, "http-proxy", f"127.0.0.1:{tiny_server.http_port}"),
    ]
    try:
        direct, _ = grpc_generate(tiny_server.grpc_target, timeout=120, **REQ)
        assert direct.usage.completion_tokens > 0
        for gw in (gws[0], gws[2]):
            via, entries = grpc_generate(gw.target, timeout=120, **REQ)
            assert via == direct
            check_entries(entries, decode_zero=gw.mode == "passthrough")
            assert entries["srv.prefill"] > 0 and entries["srv.decode_steps"] > 0  # real inference, timed
        d_chunks, _ = grpc_stream(tiny_server.grpc_target, timeout=120, **REQ)
        v_chunks, entries = grpc_stream(gws[0].target, timeout=120, **REQ)
        assert v_chunks == d_chunks
        check_entries(entries, decode_zero=True)
        s1, _, b1 = http_post(f"{tiny_server.http_url}/v1/generate", REQ, timeout=120)
        s3, _, b3 = http_post(f"{tiny_server.http_url}/v1/generate", {**REQ, "stream": True}, timeout=120)
        for gw in (gws[1], gws[3]):  # transcode, http-proxy
            s2, h2, b2 = http_post(f"{gw.url}/v1/generate", REQ, timeout=120)
            assert s1 == s2 == 200 and json.loads(b1) == json.loads(b2)
            check_entries(timing.parse(h2["Server-Timing"]), decode_zero=gw.mode == "http-proxy")
            s4, _, b4 = http_post(f"{gw.url}/v1/generate", {**REQ, "stream": True}, timeout=120)
            assert s3 == s4 == 200
            assert strip_timing(sse_events(b4)) == strip_timing(sse_events(b3))
    finally:
        for gw in gws:
            gw.stop()
