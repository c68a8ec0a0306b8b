"""One trace through client -> gateway -> server, exported over real OTLP/gRPC, per mode."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from pathprobe import telemetry, timing
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

from tests.support.clients import http_post, sse_events
from tests.support.procs import Server
from tests.test_gateway import REQ, Gateway

KIND = {"SERVER": 2, "CLIENT": 3, "INTERNAL": 1}


@pytest.fixture(scope="module")
def receiver():
    from tests.support.otlp import OTLPReceiver

    rec = OTLPReceiver().start()
    yield rec
    rec.stop()


@pytest.fixture(scope="module")
def traced_server(receiver, tmp_path_factory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("traced"),
        "--engine",
        "synthetic",
        "--decode-ms-per-token",
        "0.5",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint},
    )
    yield srv
    srv.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,impl,stream",
    [
        ("passthrough", "h2", False),
        ("passthrough", "h2", True),
        ("passthrough", "grpc", False),
        ("passthrough", "grpc", True),
        ("transcode", None, False),
        ("transcode", None, True),
        ("reencode", None, False),
        ("reencode", None, True),
        ("http-proxy", None, False),
        ("http-proxy", None, True),
    ],
)
def test_trace_chains_client_gateway_server(tmp_path, receiver, traced_server, mode, impl, stream) -> None:
    up = f"127.0.0.1:{traced_server.http_port}" if mode in ("reencode", "http-proxy") else traced_server.grpc_target
    gw = Gateway(
        tmp_path, mode, up, *(("--impl", impl) if impl else ()), env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
    )
    provider = TracerProvider(resource=Resource.create({"service.name": "test-client"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=receiver.endpoint, insecure=True)))
    tracer = provider.get_tracer("test")
    try:
        with tracer.start_as_current_span("client call", kind=SpanKind.CLIENT) as cspan:
            carrier: dict[str, str] = {}
            telemetry.inject(carrier)
            if mode in ("passthrough", "reencode"):
                with grpc.insecure_channel(gw.target) as ch:
                    stub = llm_pb2_grpc.LLMStub(ch)
                    if stream:
                        call = stub.GenerateStream(
                            llm_pb2.GenerateRequest(**REQ), metadata=tuple(carrier.items()), timeout=10
                        )
                        assert list(call)
                        entries = timing.from_metadata(call.trailing_metadata())
                    else:
                        _, call = stub.Generate.with_call(
                            llm_pb2.GenerateRequest(**REQ), metadata=tuple(carrier.items()), timeout=10
                        )
                        entries = timing.from_metadata(call.trailing_metadata())
            else:
                status, headers, body = http_post(f"{gw.url}/v1/generate", {**REQ, "stream": stream}, headers=carrier)
                assert status == 200
                entries = (
                    timing.parse(sse_events(body)[-2]["server_timing"])
                    if stream
                    else timing.parse(headers["Server-Timing"])
                )
        tid = cspan.get_span_context().trace_id.to_bytes(16, "big")
        client_id = cspan.get_span_context().span_id.to_bytes(8, "big")
        provider.shutdown()

        def complete(spans) -> bool:
            mine = [(svc, sp) for svc, sp in spans if sp.trace_id == tid]
            services = {svc for svc, _ in mine}
            # the gateway's SERVER span ends after its children: it may come in a later export batch
            gw_server = any(svc == "pathprobe-gateway" and sp.kind == KIND["SERVER"] for svc, sp in mine)
            return {"test-client", "pathprobe-gateway", "pathprobe-server"} <= services and gw_server

        receiver.wait_for(complete, timeout=20)
        spans = receiver.trace(tid)
    finally:
        gw.stop()
    assert "gw.total" in entries and "srv.total" in entries
    by_service: dict[str, list] = {}
    for svc, sp in spans:
        by_service.setdefault(svc, []).append(sp)
    gw_spans = by_service.get("pathprobe-gateway", [])
    gw_server = [sp for sp in gw_spans if sp.kind == KIND["SERVER"]]
    assert len(gw_server) == 1, [(sp.name, sp.kind) for sp in gw_spans]
    gw_server = gw_server[0]
    assert gw_server.parent_span_id == client_id  # the client's traceparent continued
    gw_client = [sp for sp in gw_spans if sp.kind == KIND["CLIENT"]]
    assert len(gw_client) == 1 and gw_client[0].parent_span_id == gw_server.span_id
    srv_server = [sp for sp in by_service.get("pathprobe-server", []) if sp.kind == KIND["SERVER"]]
    assert len(srv_server) == 1 and srv_server[0].parent_span_id == gw_client[0].span_id
    attrs = {a.key: a.value for a in gw_server.attributes}
    if mode in ("passthrough", "reencode"):
        assert attrs["rpc.system"].string_value == "grpc"
        assert attrs["rpc.method"].string_value == ("GenerateStream" if stream else "Generate")
        assert attrs["rpc.grpc.status_code"].int_value == 0
    else:
        assert attrs["http.request.method"].string_value == "POST"
        assert attrs["http.response.status_code"].int_value == 200
    if mode in ("transcode", "reencode"):  # transcoding work as child spans
        children = {sp.name for sp in gw_spans if sp.parent_span_id == gw_server.span_id}
        assert {"gw.decode", "gw.encode"} <= children, children

    # the gateway's spans are placed where its gw.* entries were measured, so `pathprobe analyze`
    # gets the in-band values from span timing alone (µs: Server-Timing has 3 decimals)
    def dur(sp) -> float:
        return (sp.end_time_unix_nano - sp.start_time_unix_nano) / 1e6

    assert abs(dur(gw_server) - entries["gw.total"]) <= 0.002, (dur(gw_server), entries)
    assert abs(dur(gw_client[0]) - entries["gw.upstream"]) <= 0.002, (dur(gw_client[0]), entries)
    assert gw_server.start_time_unix_nano <= gw_client[0].start_time_unix_nano
    assert gw_client[0].end_time_unix_nano <= gw_server.end_time_unix_nano
    assert {a.key: a.value for a in gw_client[0].attributes}["pathprobe.entry"].string_value == "gw.upstream"
    by_entry: dict[str, float] = {}
    for sp in gw_spans:
        if sp.parent_span_id == gw_server.span_id and sp.kind != KIND["CLIENT"]:
            entry = {a.key: a.value for a in sp.attributes}["pathprobe.entry"].string_value
            # gw.wait: the gateway's wait for its loop before its first timestamp (asyncio front ends);
            # gw.upwait: its wait for its loop inside gw.upstream (the answer in, the loop busy)
            assert entry in ("gw.decode", "gw.encode", "gw.send", "gw.wait", "gw.upwait") and entry == sp.name, entry
            by_entry[entry] = by_entry.get(entry, 0.0) + dur(sp)
    for entry in ("gw.decode", "gw.encode"):
        assert abs(by_entry.get(entry, 0.0) - entries[entry]) <= 0.005, (entry, by_entry, entries)
    for entry in ("gw.wait", "gw.upwait"):
        if entry in by_entry or entries.get(entry):  # a span for the entry, of its length
            assert abs(by_entry.get(entry, 0.0) - entries.get(entry, 0.0)) <= 0.005, (entry, by_entry, entries)
    if stream and mode in ("transcode", "reencode", "http-proxy"):  # the chunks' hand-offs: one interval
        assert abs(by_entry.get("gw.send", 0.0) - entries.get("gw.send", 0.0)) <= 0.005, (by_entry, entries)
    # and the exact string the client got is on the span
    assert timing.parse(attrs["server_timing"].string_value) == entries
