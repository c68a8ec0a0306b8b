"""Server spans exported over real OTLP/gRPC: tree, parent from traceparent, durations = in-band."""

from __future__ import annotations

import json

import pytest

from tests.support.clients import grpc_generate, http_post
from tests.support.procs import Server

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"

ENTRY_OF_SPAN = {
    "server.decode": "srv.decode",
    "engine.tokenize": "srv.tokenize",
    "engine.queue": "srv.queue",
    "engine.prefill": "srv.prefill",
    "engine.decode_steps": "srv.decode_steps",
    "engine.detokenize": "srv.detokenize",
    "server.encode": "srv.encode",
}


def _ms(span) -> float:
    return (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_server_spans_match_inband(tmp_path, otlp_receiver, transport: str) -> None:
    srv = Server(
        tmp_path,
        "--engine",
        "synthetic",
        "--prefill-ms-per-token",
        "0.2",
        "--decode-ms-per-token",
        "2",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.endpoint},
    )
    try:
        traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
        if transport == "grpc":
            _, entries = grpc_generate(
                srv.grpc_target,
                metadata=(("traceparent", traceparent),),
                prompt="The capital of France is",
                max_tokens=6,
            )
        else:
            from pathprobe import timing

            status, headers, _ = http_post(
                f"{srv.http_url}/v1/generate",
                {"prompt": "The capital of France is", "max_tokens": 6},
                headers={"traceparent": traceparent},
            )
            assert status == 200
            entries = timing.parse(headers["Server-Timing"])
        tid = bytes.fromhex(TRACE_ID)
        spans = otlp_receiver.wait_for(lambda s: sum(sp.trace_id == tid for _, sp in s) >= 8)
    finally:
        srv.stop()
    mine = [sp for svc, sp in spans if sp.trace_id == tid]
    assert {svc for svc, sp in spans if sp.trace_id == tid} == {"pathprobe-server"}
    roots = [sp for sp in mine if sp.parent_span_id == bytes.fromhex(PARENT_ID)]
    assert len(roots) == 1
    root = roots[0]
    assert root.kind == root.SPAN_KIND_SERVER
    attrs = {a.key: a.value for a in root.attributes}
    if transport == "grpc":
        assert root.name == "pathprobe.v1.LLM/Generate"
        assert attrs["rpc.system"].string_value == "grpc" and attrs["rpc.method"].string_value == "Generate"
    else:
        assert attrs["http.request.method"].string_value == "POST"
    assert attrs["gen_ai.usage.output_tokens"].int_value == 6
    assert _ms(root) == pytest.approx(entries["srv.total"], abs=0.002)
    children = {sp.name: sp for sp in mine if sp.parent_span_id == root.span_id}
    # the HTTP front end measures its wait for the loop before the handler's entry (srv.wait): a child that
    # ends where the server span starts; grpc.aio's calls are not seen by the loop, so it has none
    wait = children.pop("server.wait", None)
    assert (wait is not None) == ("srv.wait" in entries), (transport, entries)
    if wait is not None:
        assert _ms(wait) == pytest.approx(entries["srv.wait"], abs=0.002)
        assert abs(wait.end_time_unix_nano - root.start_time_unix_nano) <= 10_000
    assert set(children) == set(ENTRY_OF_SPAN), set(children)
    for name, entry in ENTRY_OF_SPAN.items():
        assert _ms(children[name]) == pytest.approx(entries[entry], abs=0.002), (name, entry)
        # every child lies inside the server span
        assert children[name].start_time_unix_nano >= root.start_time_unix_nano
        assert children[name].end_time_unix_nano <= root.end_time_unix_nano + 10_000
    assert json.dumps(sorted(children))  # names are plain strings
