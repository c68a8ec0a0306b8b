"""``passthrough``: any gRPC method forwarded as raw bytes, never parsed.

Design (chosen by measurement, see docs/results/*-gateway.md): a *sync* ``grpc.server``
with a generic handler and no (de)serializers, and one sync channel per upstream whose
calls run entirely on the handler's thread (``SingleThreadedUnaryStream``: the call polls
its own completion queue, no hand-off to the channel's spin thread). Unary and
server-streaming methods both go upstream as unary-stream calls: on the wire the two are
the same, and the unary-stream call can be cancelled from another thread, which gives
cancellation both ways. The grpc.aio variant of the same proxy costs several times more
per call on a small machine (thread and event-loop hand-offs).

Cardinality comes from the protobuf descriptor pool for the services this package knows
(``pathprobe.v1.LLM``, gRPC health); any other method is forwarded as a bidirectional
stream, so the upstream decides (``UNIMPLEMENTED`` for a method it does not have).
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
import grpc.experimental
from pathprobe import grpcwait, telemetry, timing
from pathprobe.auth import ApiKeys
from pathprobe.deadline import PUSHBACK_KEY
from pathprobe.errors import PathprobeError, Unavailable
from pathprobe.gateway.common import forward_metadata, grpc_timeout, upstream_credentials
from pathprobe.gateway.config import GatewayConfig
from pathprobe.gateway.metrics import Metrics
from pathprobe.gateway.upstreams import Pool, Upstream
from pathprobe.timing import now_ms
from pathprobe.tls import TlsFiles, add_port, grpc_channel

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span
    from opentelemetry.util.types import AttributeValue

log = logging.getLogger("pathprobe.gateway")

#: Environment that makes grpcio use its older poller (fewer thread hand-offs per call).
LEGACY_POLLER = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"

CHANNEL_OPTIONS = [
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]


def connect_failure(details: str | None) -> bool:
    """True when the call never reached the upstream (safe to try another one)."""
    d = (details or "").lower()
    return "failed to connect" in d or "connection refused" in d


def method_kind(method: str) -> tuple[bool, bool] | None:
    """(client_streaming, server_streaming) of a known method, else None."""
    import pathprobe.v1.llm_pb2  # noqa: F401  (registers pathprobe.v1 in the default pool)
    from google.protobuf import descriptor_pool

    try:
        import grpc_health.v1.health_pb2  # noqa: F401
    except ImportError:  # pragma: no cover
        pass
    service, _, name = method.lstrip("/").partition("/")
    try:
        md = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(name)
    except KeyError:
        return None
    if md is None:
        return None
    return md.client_streaming, md.server_streaming


class _Abort(Exception):
    pass


@dataclass(slots=True)
class _Trace:
    """A traced call's SERVER span, its context and attributes, its start (``t0``) and the start of
    the current upstream attempt (``t_up0``, its CLIENT span's)."""

    span: Span | None
    ctx: Context | None
    attrs: dict[str, AttributeValue]
    t0: float | None
    t_up0: float


#: a call with one request message: (t0, trace, upstream, upstream call, CLIENT span, upstream start)
_Parts = tuple[float, "_Trace | None", Upstream, Any, "Span | None", float]
#: the upstream call's callable on one upstream (made once per upstream and method)
_UpstreamCall = Callable[[Upstream], grpc.UnaryStreamMultiCallable]


class Passthrough(grpc.GenericRpcHandler):
    def __init__(
        self,
        pool: Pool,
        metrics: Metrics | None,
        tracing: bool,
        upstream_tls: TlsFiles | None = None,
        auth: ApiKeys | None = None,
        upstream_authorization: str | None = None,
    ) -> None:
        self.pool = pool
        self.auth = auth or ApiKeys()
        self.upstream_authorization = upstream_authorization
        self.metrics = metrics
        self.tracing = tracing
        self.tracer = telemetry.get_tracer("pathprobe.gateway") if tracing else None
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        for u in pool.upstreams:
            u.client = grpc_channel(u.target, upstream_tls, CHANNEL_OPTIONS)

    # -------------------------------------------------------------- handler lookup
    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        h = self._handlers.get(method)
        if h is None:
            h = self._handlers[method] = self._make_handler(method)
        return h

    def _make_handler(self, method: str) -> grpc.RpcMethodHandler:
        kind = method_kind(method)
        callables: dict[int, grpc.UnaryStreamMultiCallable] = {}
        bmethod = method

        def upstream_call(u: Upstream) -> grpc.UnaryStreamMultiCallable:
            mc = callables.get(u.index)
            if mc is None:
                mc = callables[u.index] = u.client.unary_stream(bmethod)
            return mc

        if kind is None or kind[0]:
            return grpc.stream_stream_rpc_method_handler(self._bidi_handler(method))
        if kind[1]:
            return grpc.unary_stream_rpc_method_handler(self._stream_handler(method, upstream_call))
        return grpc.unary_unary_rpc_method_handler(self._unary_handler(method, upstream_call))

    # -------------------------------------------------------------- shared pieces
    def _credentials(self, md: list) -> list:
        """Check the caller's key (raises Unauthenticated); the metadata to send upstream."""
        if self.auth:
            self.auth.check_mapping({k: v for k, v in md if isinstance(v, str)})
        return upstream_credentials(md, self.upstream_authorization)

    def _start(self, method: str, ctx: grpc.ServicerContext, md: list, t0: float) -> _Trace | None:
        if self.tracer is None:
            return None
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        carrier = {k: v for k, v in md if isinstance(v, str)}
        parent = telemetry.extract(carrier)
        service, _, name = method.lstrip("/").partition("/")
        attrs: dict[str, AttributeValue] = {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": name,
            "pathprobe.gateway.mode": "passthrough",
        }
        span = self.tracer.start_span(
            method.lstrip("/"),
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attrs,
            start_time=telemetry.mono_ms_to_wall_ns(t0),
        )
        return _Trace(span, trace.set_span_in_context(span), attrs, t0, t0)

    def _client_span(
        self, tr: _Trace | None, method: str, u: Upstream, md: list, t_up0: float
    ) -> tuple[Span | None, list]:
        if tr is None or self.tracer is None:
            return None, md
        from opentelemetry.trace import SpanKind

        host, _, port = u.target.rpartition(":")
        span = self.tracer.start_span(
            method.lstrip("/"),
            context=tr.ctx,
            kind=SpanKind.CLIENT,
            attributes={**tr.attrs, "server.address": host, "server.port": int(port), "pathprobe.entry": "gw.upstream"},
            start_time=telemetry.mono_ms_to_wall_ns(t_up0),
        )
        tr.t_up0 = t_up0
        from opentelemetry import trace

        carrier: dict[str, str] = {}
        telemetry.inject(carrier, trace.set_span_in_context(span))
        md = [(k, v) for k, v in md if k not in ("traceparent", "tracestate")] + list(carrier.items())
        return span, md

    @staticmethod
    def _end_spans(
        tr: _Trace | None,
        cspan: Span | None,
        code: grpc.StatusCode,
        details: str = "",
        own: dict[str, float] | None = None,
        sent: str | None = None,
    ) -> None:
        """End the spans at the instants ``own`` (the gw.* entries) was measured at."""
        from opentelemetry.trace import Status, StatusCode

        if tr is not None and tr.span is not None and sent:
            tr.span.set_attribute("server_timing", sent)
        for span, start, key in (
            (cspan, tr.t_up0 if tr else None, "gw.upstream"),
            (tr.span if tr else None, tr.t0 if tr else None, "gw.total"),
        ):
            if span is None:
                continue
            span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code is not grpc.StatusCode.OK:
                span.set_status(Status(StatusCode.ERROR, details))
            if own is not None and start is not None:
                span.end(end_time=telemetry.mono_ms_to_wall_ns(start + own[key]))
            else:
                span.end()

    def _trailing(self, call: Any, t0: float, t_up: float, u: Upstream | None = None) -> tuple[list, dict[str, float]]:
        """Upstream trailing metadata with ``gw.*`` appended to ``server-timing`` (the last item).

        A failure to read the upstream's trailers is logged and counted
        (``pathprobe_gateway_trailer_errors_total``); the call still gets the gateway's own entries.
        """
        own = {"gw.decode": 0.0, "gw.upstream": t_up, "gw.encode": 0.0, "gw.total": now_ms() - t0}
        out = []
        upstream_st = None
        try:
            tm = call.trailing_metadata() or ()
        except Exception as exc:
            tm = ()
            target = u.target if u is not None else "?"
            log.warning("upstream %s: cannot read the trailing metadata: %s: %s", target, type(exc).__name__, exc)
            if self.metrics is not None:
                self.metrics.trailer_error(target, type(exc).__name__)
        for k, v in tm:
            if k == timing.METADATA_KEY:
                upstream_st = v if upstream_st is None else f"{upstream_st}, {v}"
            else:
                out.append((k, v))
        out.append((timing.METADATA_KEY, timing.append(upstream_st, own)))
        return out, own

    def _fail(
        self,
        ctx: grpc.ServicerContext,
        u: Upstream | None,
        err: grpc.RpcError | PathprobeError,
        call: Any,
        t0: float,
        t_up: float,
        method: str,
        tr: _Trace | None,
        cspan: Span | None,
    ) -> NoReturn:
        """End the call with ``err``'s status (``ctx.abort`` raises), trailers carrying the timing."""
        if isinstance(err, grpc.RpcError):
            code, details = err.code(), err.details()
        else:  # a PathprobeError raised by the gateway itself
            code, details = getattr(err, "grpc_code", grpc.StatusCode.INTERNAL), str(err)
        if (
            u is not None
            and code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
            and not (details or "").startswith("upstream ")
        ):
            details = f"upstream {u.target}: {details}"
        if u is not None and code is grpc.StatusCode.UNAVAILABLE and self.metrics is not None:
            self.metrics.upstream_error(u.target, code.name)
        if call is not None:
            md, own = self._trailing(call, t0, t_up, u)
        else:
            own = {"gw.decode": 0.0, "gw.upstream": t_up, "gw.encode": 0.0, "gw.total": now_ms() - t0}
            md = [(timing.METADATA_KEY, timing.format_entries(own))]
            retry = getattr(err, "retry_after_ms", None)
            if retry is not None:  # our own refusal (--max-inflight): the retry hint goes first
                md.insert(0, (PUSHBACK_KEY, str(int(retry))))
        ctx.set_trailing_metadata(md)
        if self.metrics is not None:
            self.metrics.observe(method, code.name, now_ms() - t0, u.target if u else None, t_up)
        if tr is not None:
            self._end_spans(tr, cspan, code, details, own, md[-1][1])
        ctx.abort(code, details)
        raise AssertionError("grpc's ServicerContext.abort always raises")  # for the type checker

    def _open(
        self,
        method: str,
        request: bytes,
        ctx: grpc.ServicerContext,
        upstream_call: _UpstreamCall,
        tr: _Trace | None,
        md: list,
        timeout: float | None,
    ) -> tuple[Upstream, Any, Span | None, float]:
        """Start the upstream call, trying another upstream only when one refused to connect."""
        tried: tuple[Upstream, ...] = ()
        while True:
            u = self.pool.acquire(tried)
            t_up0 = now_ms()
            cspan, cmd = self._client_span(tr, method, u, md, t_up0)
            cmd = list(cmd or ())
            up_timeout = grpcwait.declare(timeout, cmd)  # the server measures how long it held the call
            call = upstream_call(u)(request, timeout=up_timeout, metadata=cmd or None)
            if not ctx.add_callback(call.cancel):
                call.cancel()
            if len(self.pool.upstreams) == 1:
                return u, call, cspan, t_up0
            # Multi-upstream: wait for the response headers so a refused connection can fail over.
            try:
                call.initial_metadata()
            except grpc.RpcError:
                pass
            if call.done() and call.code() is grpc.StatusCode.UNAVAILABLE and connect_failure(call.details()):
                self.pool.release(u)
                u.mark(False, call.details() or "connect failed")
                if cspan is not None:
                    self._end_spans(
                        _Trace(None, None, {}, None, t_up0),
                        cspan,
                        grpc.StatusCode.UNAVAILABLE,
                        call.details() or "",
                        {"gw.upstream": now_ms() - t_up0},
                    )
                tried += (u,)
                if len(tried) >= len(self.pool.upstreams):
                    return u, call, None, t_up0  # report the last refusal (release handled by caller)
                continue
            return u, call, cspan, t_up0

    # -------------------------------------------------------------- the three shapes
    def _begin(self, method: str, request: bytes, ctx: grpc.ServicerContext, upstream_call: _UpstreamCall) -> _Parts:
        """A call with one request message: its start, SERVER span, key check and upstream call
        (t0, spans, upstream, call, CLIENT span, upstream start); a refusal ends the call here."""
        t0 = now_ms()
        md = forward_metadata(ctx.invocation_metadata())
        tr = self._start(method, ctx, md, t0)
        timeout = grpc_timeout(ctx.time_remaining())
        try:
            md = self._credentials(md)
            u, call, cspan, t_up0 = self._open(method, request, ctx, upstream_call, tr, md, timeout)
        except PathprobeError as exc:
            self._fail(ctx, None, exc, None, t0, 0.0, method, tr, None)
        return t0, tr, u, call, cspan, t_up0

    def _upstream_failed(
        self, ctx: grpc.ServicerContext, call: Any, err: grpc.RpcError, parts: _Parts, method: str
    ) -> NoReturn:
        """The upstream call ended with an error: mark a lost upstream, end the call with it."""
        t0, tr, u, _call, cspan, t_up0 = parts
        t_up = now_ms() - t_up0
        if err.code() is grpc.StatusCode.UNAVAILABLE and not call.trailing_metadata():
            u.mark(False, err.details() or "")
        self._fail(ctx, u, err, call, t0, t_up, method, tr, cspan)

    def _done(self, method: str, parts: _Parts, t_up: float, tm: list, own: dict[str, float]) -> None:
        """Count and trace a call that ended OK (its trailers ``tm`` are set)."""
        _t0, tr, u, _call, cspan, _t_up0 = parts
        if self.metrics is not None:
            self.metrics.observe(method, "OK", own["gw.total"], u.target, t_up)
        if tr is not None:
            self._end_spans(tr, cspan, grpc.StatusCode.OK, "", own, tm[-1][1])

    def _unary_handler(
        self, method: str, upstream_call: _UpstreamCall
    ) -> Callable[[bytes, grpc.ServicerContext], bytes | None]:
        pool = self.pool

        def handler(request: bytes, ctx: grpc.ServicerContext) -> bytes | None:
            parts = self._begin(method, request, ctx, upstream_call)
            t0, _tr, u, call, _cspan, t_up0 = parts
            try:
                resp = None
                try:
                    for resp in call:  # noqa: B007 - the last (the only) response is what is answered
                        pass
                except grpc.RpcError as err:
                    self._upstream_failed(ctx, call, err, parts, method)
                t_up = now_ms() - t_up0
                im = call.initial_metadata()
                if im:
                    ctx.send_initial_metadata(im)
                tm, own = self._trailing(call, t0, t_up, u)
                ctx.set_trailing_metadata(tm)
            finally:
                pool.release(u)
            self._done(method, parts, t_up, tm, own)
            return resp

        return handler

    def _stream_handler(
        self, method: str, upstream_call: _UpstreamCall
    ) -> Callable[[bytes, grpc.ServicerContext], Iterator[bytes]]:
        pool = self.pool

        def handler(request: bytes, ctx: grpc.ServicerContext) -> Iterator[bytes]:
            parts = self._begin(method, request, ctx, upstream_call)
            t0, _tr, u, call, _cspan, t_up0 = parts
            try:
                try:
                    first = True
                    for msg in call:
                        if first:
                            first = False
                            im = call.initial_metadata()
                            if im:
                                ctx.send_initial_metadata(im)
                        yield msg
                except grpc.RpcError as err:
                    self._upstream_failed(ctx, call, err, parts, method)
                t_up = now_ms() - t_up0
                tm, own = self._trailing(call, t0, t_up, u)
                ctx.set_trailing_metadata(tm)
            finally:
                # a client that went away closes this generator: the upstream call goes too
                call.cancel()
                pool.release(u)
            self._done(method, parts, t_up, tm, own)

        return handler

    def _bidi_handler(self, method: str) -> Callable[[Iterator[bytes], grpc.ServicerContext], Iterator[bytes]]:
        pool = self.pool
        callables: dict[int, grpc.StreamStreamMultiCallable] = {}

        def handler(request_iterator: Iterator[bytes], ctx: grpc.ServicerContext) -> Iterator[bytes]:
            t0 = now_ms()
            md = forward_metadata(ctx.invocation_metadata())
            try:
                md = self._credentials(md)
                u = pool.acquire()
            except PathprobeError as exc:
                self._fail(ctx, None, exc, None, t0, 0.0, method, None, None)
            mc = callables.get(u.index)
            if mc is None:
                mc = callables[u.index] = u.client.stream_stream(method)
            t_up0 = now_ms()
            up_timeout = grpcwait.declare(grpc_timeout(ctx.time_remaining()), md)
            call = mc(request_iterator, timeout=up_timeout, metadata=md)
            if not ctx.add_callback(call.cancel):
                call.cancel()
            try:
                try:
                    yield from call
                except grpc.RpcError as err:
                    self._fail(ctx, u, err, call, t0, now_ms() - t_up0, method, None, None)
                tm, _ = self._trailing(call, t0, now_ms() - t_up0, u)
                ctx.set_trailing_metadata(tm)
            finally:
                call.cancel()
                pool.release(u)

        return handler


def serve(cfg: GatewayConfig, pool: Pool, metrics: Metrics | None, tracing: bool) -> int:
    """Run the passthrough server until SIGTERM/SIGINT."""
    host, port = cfg.listen_host, cfg.listen_port
    children: list[subprocess.Popen] = []
    if cfg.workers > 1 and not cfg.worker_child:
        # Extra processes bind the same port (SO_REUSEPORT, grpc's default on Linux).
        argv = [a for a in sys.argv[1:]]
        for _ in range(1, cfg.workers):
            children.append(subprocess.Popen([sys.executable, "-m", "pathprobe", *argv, "--worker-child"]))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=cfg.threads, thread_name_prefix="gw"),
        handlers=(Passthrough(pool, metrics, tracing, cfg.upstream_tls_files, cfg.auth, cfg.upstream_authorization),),
        options=[
            ("grpc.max_receive_message_length", cfg.max_body_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1),
        ],
    )
    bound = add_port(server, f"{host}:{port}", cfg.tls)
    if not bound:
        raise Unavailable(f"--listen: cannot bind {host}:{port}")
    server.start()
    log.warning("passthrough gateway on %s:%d -> %s (%s)", host, bound, pool.names(), pool.balance)
    print(f"pathprobe gateway: passthrough listening on {host}:{bound} -> {pool.names()}", flush=True)
    done = threading.Event()

    def stop(_sig: int, _frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    done.wait()
    pool.draining = True
    for c in children:
        c.send_signal(signal.SIGTERM)
    if cfg.drain_delay_s > 0:
        time.sleep(cfg.drain_delay_s)
    server.stop(grace=cfg.drain_grace_s).wait()  # new calls refused, in-flight ones waited for
    for c in children:
        try:
            c.wait(5)
        except subprocess.TimeoutExpired:
            c.kill()
    return 0
