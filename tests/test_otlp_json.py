"""Our direct OTLP JSON encoder gives exactly what OpenTelemetry's protobuf encoder gives."""

from __future__ import annotations

import base64
import json

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)
from opentelemetry.trace.span import TraceState
from pathprobe import _otlpjson
from pathprobe.telemetry import OTLPJsonLinesExporter


def _reference(spans) -> dict:
    def hexify(node):
        if isinstance(node, dict):
            return {
                k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") and v else hexify(v))
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [hexify(x) for x in node]
        return node

    return hexify(json_format.MessageToDict(encode_spans(spans)))


def _spans():
    mem = InMemorySpanExporter()
    out = []
    for service in ("svc-a", "svc-b"):
        provider = TracerProvider(resource=Resource.create({"service.name": service, "n": 3}))
        provider.add_span_processor(SimpleSpanProcessor(mem))
        tracer = provider.get_tracer("scope-1", "1.2")
        other = provider.get_tracer("scope-2")
        remote = SpanContext(
            0x4BF92F3577B34DA6A3CE929D0E0E4736,
            0x00F067AA0BA902B7,
            is_remote=True,
            trace_flags=TraceFlags(1),
            trace_state=TraceState([("k", "v")]),
        )
        ctx = set_span_in_context(NonRecordingSpan(remote))
        with tracer.start_as_current_span(
            "root",
            context=ctx,
            kind=SpanKind.SERVER,
            attributes={
                "s": "x",
                "i": 3,
                "f": 1.5,
                "b": True,
                "l": ["a", "b"],
                "li": [1, 2],
                "lf": [0.5],
                "lb": [True],
                "empty": "",
            },
            links=[Link(remote, {"why": "batch"})],
        ) as root:
            root.add_event("tick", {"k": 1})
            root.add_event("bare")
            with other.start_as_current_span("child", kind=SpanKind.CLIENT) as child:
                child.set_status(Status(StatusCode.ERROR, "bad"))
            with tracer.start_as_current_span("ok-child") as ok:
                ok.set_status(Status(StatusCode.OK))
        out.extend(mem.get_finished_spans())
        mem.clear()
    return out


def test_direct_encoder_equals_opentelemetry_encoder() -> None:
    spans = _spans()
    assert _otlpjson.encode(spans) == _reference(spans)


def test_exporter_writes_one_json_line_per_batch(tmp_path) -> None:
    path = tmp_path / "spans.jsonl"
    exporter = OTLPJsonLinesExporter(str(path))
    spans = _spans()
    exporter.export(spans[:3])
    exporter.export(spans[3:])
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    merged = [
        s for line in lines for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
    ]
    assert len(merged) == len(spans)
