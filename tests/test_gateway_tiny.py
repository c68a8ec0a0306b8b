"""The gateway in front of the real transformers engine (tiny model): same answers as direct."""

from __future__ import annotations

import json

import pytest

from tests.support.clients import grpc_generate, grpc_stream, http_post, sse_events
from tests.test_gateway import Gateway, check_entries, strip_timing

REQ = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.0}


@pytest.mark.slow
def test_tiny_engine_through_passthrough_and_transcode(tmp_path, tiny_server) -> None:
    gws = [Gateway(tmp_path, "passthrough", tiny_server.grpc_target),
           Gateway(tmp_path, "transcode", tiny_server.grpc_target),
           Gateway(tmp_path, "reencode", f"127.0.0.1:{tiny_server.http_port}")]
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
        s2, _, b2 = http_post(f"{gws[1].url}/v1/generate", REQ, timeout=120)
        assert s1 == s2 == 200 and json.loads(b1) == json.loads(b2)
        s1, _, b1 = http_post(f"{tiny_server.http_url}/v1/generate", {**REQ, "stream": True}, timeout=120)
        s2, _, b2 = http_post(f"{gws[1].url}/v1/generate", {**REQ, "stream": True}, timeout=120)
        assert strip_timing(sse_events(b2)) == strip_timing(sse_events(b1))
    finally:
        for gw in gws:
            gw.stop()
