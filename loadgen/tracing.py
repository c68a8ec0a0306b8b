"""OpenTelemetry for the load generator: a CLIENT span per request, ``traceparent`` injected
into the request's metadata / headers, the span placed on the record's own clock (span
duration == e2e) and carrying the client's own durations and the split.

Spans are exported between requests (:meth:`Tracing.drain`, called by the runtime's
flush), never by a thread that competes for the interpreter lock while a response waits, and in a
greenlet of their own, so that a user Locust kills at a test's end loses none of them.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import gevent
import gevent.pool
from pathprobe import genai
from pathprobe.loadgen.call import CallSpec, Target
from pathprobe.loadgen.config import Config
from pathprobe.loadgen.slices import in_slices
from pathprobe.records import RequestRecord

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue
    from pathprobe.telemetry import DeferredSpanProcessor

log = logging.getLogger(__name__)

#: how long the test's end waits for the spans to be exported (the master waits ``stop_timeout``
#: + 30 s for a worker's final batch, which is sent after them)
SHUTDOWN_S = 15.0

#: spans per slice of a periodic drain (one slice is ~1 ms of encoding and writing on this
#: class of machine; the event loop runs between slices)
SPAN_SLICE = 16


class Tracing:
    """A CLIENT span per request; ``traceparent`` injected into metadata/headers."""

    def __init__(
        self, tracer: Tracer, provider: TracerProvider | None, deferred: list[DeferredSpanProcessor] | None = None
    ) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from pathprobe import telemetry

        self.tracer = tracer
        self.provider = provider
        self.deferred = list(deferred or ())
        self._drains = gevent.pool.Group()
        self._trace = trace
        self._kind = SpanKind.CLIENT
        self._status = Status
        self._code = StatusCode
        self._inject = telemetry.inject
        self._wall = telemetry.mono_ms_to_wall_ns

    @classmethod
    def create(cls, cfg: Config, options: argparse.Namespace | None) -> Tracing | None:
        from opentelemetry import trace
        from pathprobe import telemetry

        locust_otel = bool(getattr(options, "otel", False))
        if locust_otel and hasattr(trace.get_tracer_provider(), "add_span_processor"):
            # Locust's --otel owns the global provider (and its OTLP exporter): use it.
            provider = trace.get_tracer_provider()
            if cfg.traces_file and hasattr(provider, "add_span_processor"):
                mine = telemetry.DeferredSpanProcessor(telemetry.OTLPJsonLinesExporter(cfg.traces_file))
                provider.add_span_processor(mine)
                return cls(provider.get_tracer("pathprobe.loadgen"), None, [mine])
            return cls(provider.get_tracer("pathprobe.loadgen"), None)
        # spans are exported between requests (Runtime.flush), not by a thread that competes for the
        # interpreter lock while a response waits to be timed
        own = telemetry.setup_tracing(
            "pathprobe-loadgen", traces_file=cfg.traces_file or None, set_global=False, deferred=True
        )
        if own is None:
            return None
        return cls(own.get_tracer("pathprobe.loadgen"), own, telemetry.deferred_processors(own))

    def drain(self, pause: Callable[[], None] | None = None) -> None:
        """Export the spans finished since the last call (in this thread, between requests).

        ``pause`` (the periodic flush: ``gevent.sleep(0)``): called between slices of
        :data:`SPAN_SLICE` spans, so other users' responses are read while a large batch is
        encoded; spans that end meanwhile wait for the next call.

        The export runs in a greenlet of its own, which the caller waits for. Locust kills its
        users at a test's end (at once: ``stop_timeout`` 0), and a user killed inside an export
        (an OTLP call waits for its answer) would drop the slice the export had taken off the
        queue, silently: the distributed test missed its last request's span in about one run of
        sixteen. Killed now, the caller leaves and the export goes on; :meth:`shutdown` waits
        for it."""
        self._drains.spawn(self._drain, pause).join()

    def _drain(self, pause: Callable[[], None] | None) -> None:
        for p in self.deferred:
            if pause is None:
                p.drain()
            else:
                in_slices(p.drain, len(p.pending), SPAN_SLICE, pause)

    def start(self, route: str, target: Target, spec: CallSpec, headers: dict[str, str]) -> tuple[Span, int]:
        """Start the CLIENT span; returns it and its start (perf_counter_ns), which becomes the
        request's t0, so span duration == e2e exactly (traceparent injection counts as client encode)."""
        attrs: dict[str, AttributeValue] = {
            "pathprobe.route": route,
            "gen_ai.operation.name": genai.operation_name(route),
            "gen_ai.provider.name": genai.provider_name(route),
            "gen_ai.request.max_tokens": spec.max_tokens,
            "pathprobe.request_id": spec.request_id,
        }
        if target.kind == "grpc":
            method = "GenerateStream" if spec.stream else "Generate"
            host, _, port = target.address.rpartition(":")
            attrs.update(
                {
                    "rpc.system": "grpc",
                    "rpc.service": "pathprobe.v1.LLM",
                    "rpc.method": method,
                    "server.address": host,
                    "server.port": int(port) if port.isdigit() else 0,
                }
            )
        else:
            attrs.update({"http.request.method": "POST", "url.full": target.address})
        # placed on the same monotonic clock as the record, so span duration == e2e
        t0 = time.perf_counter_ns()
        span = self.tracer.start_span(route, kind=self._kind, attributes=attrs, start_time=self._wall(t0 / 1e6))
        self._inject(headers, self._trace.set_span_in_context(span))
        return span, t0

    def end(self, span: Span | None, rec: RequestRecord, t_end_ns: int = 0) -> None:
        """End the span :meth:`start` returned (``span`` None only where no span was started)."""
        assert span is not None, "Tracing.end: a span from Tracing.start"
        ctx = span.get_span_context()
        if ctx.is_valid and ctx.trace_flags.sampled:  # only ids of traces that are exported
            rec["trace_id"] = f"{ctx.trace_id:032x}"
        if rec["tokens_out"] is not None:
            span.set_attribute("gen_ai.usage.output_tokens", rec["tokens_out"])
        if rec["tokens_in"] is not None:
            span.set_attribute("gen_ai.usage.input_tokens", rec["tokens_in"])
        span.set_attribute("pathprobe.status", rec["status"])
        if rec["status"].isdigit():
            span.set_attribute("http.response.status_code", int(rec["status"]))
        elif rec["route"].startswith("grpc."):
            span.set_attribute("rpc.grpc.status_code", rec["status"])
        # the client's own durations (what trace-based analysis needs from this hop)
        span.set_attribute("pathprobe.client.encode_ms", round(rec["client_encode_ms"], 4))
        span.set_attribute("pathprobe.client.decode_ms", round(rec["client_decode_ms"], 4))
        span.set_attribute("pathprobe.e2e_ms", round(rec["e2e_ms"], 4))
        if rec.get("client_wait_ms"):
            span.set_attribute("pathprobe.client.wait_ms", round(rec["client_wait_ms"], 4))
        if rec["schedule_lag_ms"]:
            span.set_attribute("pathprobe.schedule_lag_ms", round(rec["schedule_lag_ms"], 4))
        if rec["split"]:
            for k, v in rec["split"].items():
                if isinstance(v, float):  # the segments; per-link and per-hop lists stay in the record
                    span.set_attribute(f"pathprobe.split.{k}_ms", round(v, 4))
        if (estimate := rec.get("network_estimate_ms")) is not None:
            span.set_attribute("pathprobe.network_estimate_ms", round(estimate, 4))
        if rec.get("network_estimate_kind"):
            span.set_attribute("pathprobe.network_estimate_kind", rec["network_estimate_kind"])
        if rec["ttft_ms"] is not None:
            span.set_attribute("pathprobe.ttft_ms", round(rec["ttft_ms"], 4))
            # the conventions' span attribute for the same instant (seconds)
            span.set_attribute("gen_ai.response.time_to_first_chunk", rec["ttft_ms"] / 1e3)
        if not rec["ok"]:
            span.set_attribute("error.type", rec["status"])
        if not rec["ok"]:
            span.set_status(self._status(self._code.ERROR, f"{rec['status']}: {rec['error']}"))
        span.end(end_time=self._wall(t_end_ns / 1e6) if t_end_ns else None)

    def shutdown(self, timeout_s: float = SHUTDOWN_S) -> bool:
        """Every span out: the exports under way (their callers killed, :meth:`drain`), then the rest.

        Waits ``timeout_s`` at most (a worker sends its final batch after this, and the master
        waits for that batch only so long); past it, says how many spans were not sent and
        returns False."""
        with gevent.Timeout(timeout_s, False):
            self._drains.join()
            self._drain(None)
            if self.provider is not None:
                self.provider.force_flush()
                self.provider.shutdown()
            else:
                prov = self._trace.get_tracer_provider()
                if hasattr(prov, "force_flush"):
                    prov.force_flush()
            return True
        self._drains.kill(block=False)
        left = sum(len(p.pending) for p in self.deferred)
        log.warning(
            "pathprobe: the spans were not all exported within %g s at the test's end (%d not sent)", timeout_s, left
        )
        return False
