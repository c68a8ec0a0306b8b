"""OpenTelemetry set-up shared by server, gateway and load generator.

Precedence follows opentelemetry-python: constructor args over env over defaults.
Spans go to OTLP/gRPC when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, and/or to an OTLP JSON lines file
(one ``{"resourceSpans": [...]}`` object per line, the format Jaeger's UI upload and
``pathprobe analyze`` read).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind, Tracer
from opentelemetry.util.types import AttributeValue
from pathprobe import environment
from pathprobe.jsontypes import JsonObject

#: env var naming an OTLP JSON lines file to write spans to (ours; the OTLP
#: endpoint vars are the standard OTEL_* ones).
ENV_TRACES_FILE = environment.PATHPROBE_TRACES_FILE
ENV_OTLP_ENDPOINT = environment.OTEL_EXPORTER_OTLP_ENDPOINT
ENV_OTLP_TRACES_ENDPOINT = environment.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT

# offset that turns perf_counter_ns() into time.time_ns(), taken once per process
_WALL_OFFSET_NS = time.time_ns() - time.perf_counter_ns()


def mono_ms_to_wall_ns(mono_ms: float) -> int:
    """A :func:`pathprobe.timing.now_ms` reading as epoch ns, for span placement only."""
    return int(mono_ms * 1e6) + _WALL_OFFSET_NS


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> JsonObject:
    """Spans as one OTLP JSON ``ExportTraceServiceRequest`` (ids in hex, as OTLP JSON wants)."""
    from pathprobe._otlpjson import encode

    return encode(spans)


class OTLPJsonLinesExporter(SpanExporter):
    """Appends one OTLP JSON ``ExportTraceServiceRequest`` per batch to a file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = json.dumps(spans_to_otlp_json(spans), separators=(",", ":"))
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:  # nothing held open between batches
        return None


class DeferredSpanProcessor(SpanProcessor):
    """Keeps finished spans until its owner calls :meth:`drain` (which exports them, in the
    caller's thread). For a load generator: export between two requests instead of in a
    background thread that takes the interpreter lock while a response waits to be timed.

    ``max_pending`` bounds memory: beyond it the oldest batch is exported at once."""

    def __init__(self, exporter: SpanExporter, max_pending: int = 8192) -> None:
        self.exporter = exporter
        self.max_pending = max_pending
        self.pending: list[ReadableSpan] = []
        self.exported = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.pending.append(span)
        if len(self.pending) >= self.max_pending:
            self.drain()

    def drain(self, limit: int | None = None) -> int:
        """Export the pending spans, or only the oldest ``limit`` of them; returns how many."""
        if limit is None or limit >= len(self.pending):
            batch, self.pending = self.pending, []
        else:
            batch, self.pending = self.pending[:limit], self.pending[limit:]
        if batch:
            self.exporter.export(batch)
            self.exported += len(batch)
        return len(batch)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.drain()
        return True

    def shutdown(self) -> None:
        self.drain()
        self.exporter.shutdown()


def setup_tracing(
    service_name: str,
    *,
    otlp_endpoint: str | None = None,
    traces_file: str | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
    set_global: bool = True,
    deferred: bool = False,
) -> TracerProvider | None:
    """Configure a TracerProvider; returns None when no exporter is asked for.

    With no exporter, the global no-op tracer stays and span creation costs ~nothing.
    ``deferred``: spans are exported only when the caller drains the provider's
    :class:`DeferredSpanProcessor` s (``deferred_processors(provider)``), not by a thread.
    """

    def processor(exporter: SpanExporter) -> SpanProcessor:
        if deferred:
            return DeferredSpanProcessor(exporter)
        return BatchSpanProcessor(exporter, schedule_delay_millis=500)

    endpoint = otlp_endpoint or os.environ.get(ENV_OTLP_TRACES_ENDPOINT) or os.environ.get(ENV_OTLP_ENDPOINT)
    path = traces_file or os.environ.get(ENV_TRACES_FILE)
    if not endpoint and not path:
        return None
    resource = Resource.create({"service.name": service_name, **(attributes or {})})
    provider = TracerProvider(resource=resource)
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = not endpoint.startswith("https://")
        provider.add_span_processor(processor(OTLPSpanExporter(endpoint=endpoint, insecure=insecure)))
    if path:
        provider.add_span_processor(processor(OTLPJsonLinesExporter(path)))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def deferred_processors(provider: object) -> list[DeferredSpanProcessor]:
    """The :class:`DeferredSpanProcessor` s attached to ``provider`` (an SDK TracerProvider)."""
    multi = getattr(provider, "_active_span_processor", None)
    procs = getattr(multi, "_span_processors", ())
    return [p for p in procs if isinstance(p, DeferredSpanProcessor)]


def get_tracer(name: str) -> Tracer:
    return trace.get_tracer(name)


def extract(carrier: Mapping[str, str]) -> Context:
    """Context from incoming W3C ``traceparent`` / ``tracestate`` (HTTP headers or gRPC metadata)."""
    return propagate.extract(carrier)


def inject(carrier: dict[str, str], context: Context | None = None) -> dict[str, str]:
    propagate.inject(carrier, context=context)
    return carrier


def child_span(
    tracer: Tracer,
    name: str,
    parent: Span,
    start_mono_ms: float,
    dur_ms: float,
    attributes: Mapping[str, AttributeValue] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> None:
    """Record an already-measured interval as a finished child span of ``parent``."""
    if not parent.is_recording():
        return
    ctx = trace.set_span_in_context(parent)
    start = mono_ms_to_wall_ns(start_mono_ms)
    span = tracer.start_span(name, context=ctx, kind=kind, start_time=start, attributes=dict(attributes or {}))
    span.end(end_time=start + int(dur_ms * 1e6))


def shutdown(provider: TracerProvider | None) -> None:
    if provider is not None:
        provider.force_flush()
        provider.shutdown()
