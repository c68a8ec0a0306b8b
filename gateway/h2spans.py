"""OpenTelemetry spans of the calls the frame relay forwards (``--tracing``).

A SERVER span continues the client's ``traceparent``; a CLIENT span, its child, is what the
upstream sees as its parent (the forwarded ``traceparent`` names it). Both are placed where
the ``gw.*`` entries were measured: SERVER [t0, t0 + gw.total], CLIENT [t_fwd, + gw.upstream].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pathprobe import telemetry, timing
from pathprobe.gateway.h2streams import Stream
from pathprobe.timing import now_ms

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

_TRACE_KEYS = (b"traceparent", b"tracestate")


def start(
    tracer: Tracer, st: Stream, headers: list[tuple[bytes, bytes]], target: str | None
) -> list[tuple[bytes, bytes]]:
    """Start ``st``'s spans (``gw.upstream`` starts with the CLIENT span); returns the request
    headers to forward, the CLIENT span's trace context in place of the client's."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    carrier = {k.decode(): v.decode() for k, v in headers if k in _TRACE_KEYS}
    service, _, name = st.method.lstrip("/").partition("/")
    attrs = {
        "rpc.system": "grpc",
        "rpc.service": service,
        "rpc.method": name,
        "pathprobe.gateway.mode": "passthrough",
    }
    st.span = tracer.start_span(
        st.method.lstrip("/"),
        context=telemetry.extract(carrier),
        kind=SpanKind.SERVER,
        attributes=attrs,
        start_time=telemetry.mono_ms_to_wall_ns(st.t0),
    )
    host, _, port = (target or "?:0").rpartition(":")
    st.t_fwd = now_ms()
    st.cspan = tracer.start_span(
        st.method.lstrip("/"),
        context=trace.set_span_in_context(st.span),
        kind=SpanKind.CLIENT,
        attributes={
            **attrs,
            "server.address": host,
            "server.port": int(port or 0),
            "pathprobe.entry": "gw.upstream",
        },
        start_time=telemetry.mono_ms_to_wall_ns(st.t_fwd),
    )
    out: dict[str, str] = {}
    telemetry.inject(out, trace.set_span_in_context(st.cspan))
    return [(k, v) for k, v in headers if k not in _TRACE_KEYS] + [(k.encode(), v.encode()) for k, v in out.items()]


def end(st: Stream, code: str, error: str | None, own: dict[str, float], upstream_st: str | None, sent: bool) -> None:
    """End ``st``'s spans with its grpc-status; ``sent``: ``own`` went to the client (after ``upstream_st``)."""
    from opentelemetry.trace import Status, StatusCode

    if st.span is None:
        return
    if sent:  # the Server-Timing the client got: the upstream's field(s), then the gateway's
        st.span.set_attribute("server_timing", timing.append(upstream_st, own))
    for s, at in ((st.cspan, st.t_fwd + own["gw.upstream"]), (st.span, st.t0 + own["gw.total"])):
        if s is None:
            continue
        s.set_attribute("rpc.grpc.status_code", int(code) if code.isdigit() else 2)
        if code != "0":
            s.set_status(Status(StatusCode.ERROR, error or f"grpc-status {code}"))
        s.end(end_time=telemetry.mono_ms_to_wall_ns(at))
