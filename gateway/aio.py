"""asyncio helpers for the HTTP-facing and HTTP-upstream modes: spans, serving, errors."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import grpc
from aiohttp import web
from pathprobe import loopwait, telemetry, timing
from pathprobe.deadline import PUSHBACK_KEY, RETRY_AFTER, retry_after_header
from pathprobe.gateway.common import dumps, error_json, http_status_of
from pathprobe.gateway.config import GatewayConfig
from pathprobe.gateway.upstreams import Pool
from pathprobe.timing import now_ms

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.util.types import AttributeValue

log = logging.getLogger("pathprobe.gateway")

_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")


def param_of(message: str) -> str | None:
    """``"max_tokens: must be > 0"`` -> ``"max_tokens"`` (the server's messages name the field first)."""
    m = _FIELD.match(message or "")
    return m.group(1) if m else None


def json_error(
    code: grpc.StatusCode,
    message: str,
    entries: Mapping[str, float] | None = None,
    upstream_timing: str | None = None,
    status: int | None = None,
    param: str | None = None,
    server_timing: str | None = None,
    retry_after: str | None = None,
) -> web.Response:
    """Every HTTP error answer of the gateway (the body is :func:`pathprobe.errors.error_json`).

    ``server_timing``: the Server-Timing value already made; else upstream's + ``entries``.
    ``retry_after``: the ``Retry-After`` value (an overload refusal's, ours or the upstream's).
    """
    status = status or http_status_of(code)
    headers = {}
    if server_timing is not None:
        headers[timing.HTTP_HEADER] = server_timing
    elif entries is not None or upstream_timing:
        headers[timing.HTTP_HEADER] = timing.append(upstream_timing, entries or {})
    if retry_after:
        headers[RETRY_AFTER] = retry_after
    body = error_json(status, code, message, param if param is not None else param_of(message))
    return web.Response(status=status, body=dumps(body), content_type="application/json", headers=headers)


class Spans:
    """SERVER span + children for one gateway call; all no-ops when tracing is off.

    Spans are placed at the instants the ``gw.*`` entries were measured (``t0`` and the
    durations), so span durations equal the in-band values; children carry
    ``pathprobe.entry`` and the SERVER span ``server_timing`` (the string sent downstream).
    """

    __slots__ = ("attrs", "ctx", "server", "t0", "tracer")

    def __init__(
        self,
        tracing: bool,
        name: str,
        carrier: Mapping[str, str],
        attrs: dict[str, AttributeValue],
        t0: float | None = None,
    ) -> None:
        self.server: Span | None = None
        self.ctx: Context | None = None
        self.attrs = attrs
        self.tracer: Tracer | None = None
        self.t0 = t0
        if not tracing:
            return
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        self.tracer = telemetry.get_tracer("pathprobe.gateway")
        parent = telemetry.extract({k.lower(): v for k, v in carrier.items()})
        start = telemetry.mono_ms_to_wall_ns(t0) if t0 is not None else None
        self.server = self.tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=attrs, start_time=start
        )
        self.ctx = trace.set_span_in_context(self.server)

    def child(
        self, name: str, start_ms: float, dur_ms: float, attrs: Mapping[str, AttributeValue] | None = None
    ) -> None:
        """A finished child interval; ``name`` is its entry (``gw.decode`` / ``gw.encode``)."""
        if self.server is not None and self.tracer is not None:
            telemetry.child_span(
                self.tracer, name, self.server, start_ms, dur_ms, {"pathprobe.entry": name, **(attrs or {})}
            )

    def upwait(self, ms: float | None, end_ms: float) -> None:
        """``gw.upwait`` (the gateway's wait for its loop inside ``gw.upstream``) as a child interval
        ending at ``end_ms``, so a split from the spans books it as the in-band split does."""
        if ms:
            self.child("gw.upwait", end_ms - ms, ms)

    def client(
        self, name: str, attrs: Mapping[str, AttributeValue], start_ms: float | None = None
    ) -> tuple[Span | None, dict[str, str]]:
        """Start the CLIENT span of the upstream call (at ``start_ms``, the ``gw.upstream`` start);
        returns it and the headers to propagate."""
        if self.server is None or self.tracer is None:
            return None, {}
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        start = telemetry.mono_ms_to_wall_ns(start_ms) if start_ms is not None else None
        span = self.tracer.start_span(
            name,
            context=self.ctx,
            kind=SpanKind.CLIENT,
            attributes={**attrs, "pathprobe.entry": "gw.upstream"},
            start_time=start,
        )
        carrier: dict[str, str] = {}
        telemetry.inject(carrier, trace.set_span_in_context(span))
        return span, carrier

    @staticmethod
    def end_client(
        span: Span | None,
        attrs: Mapping[str, AttributeValue],
        error: str | None = None,
        start_ms: float | None = None,
        dur_ms: float | None = None,
    ) -> None:
        """End a span; with ``start_ms`` and ``dur_ms`` it ends at ``start_ms + dur_ms``."""
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        for k, v in attrs.items():
            span.set_attribute(k, v)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        if start_ms is not None and dur_ms is not None:
            span.end(end_time=telemetry.mono_ms_to_wall_ns(start_ms + dur_ms))
        else:
            span.end()

    def end(
        self,
        attrs: Mapping[str, AttributeValue],
        error: str | None = None,
        total_ms: float | None = None,
        server_timing: str | None = None,
    ) -> None:
        """End the SERVER span at ``t0 + total_ms`` (gw.total), recording the string sent downstream."""
        if self.server is None:
            return
        if server_timing:
            self.server.set_attribute("server_timing", server_timing)
        self.end_client(self.server, attrs, error, self.t0 if total_ms is not None else None, total_ms)


#: the longest a stream's loop works through chunks already in its buffers without a turn of the event
#: loop: a gap of an idle loop's size (``timing.IDLE_MS``)
READ_TURN_MS = timing.IDLE_MS
#: a gap between one chunk's hand-off and the next chunk longer than a read out of a buffer takes
#: (1-5 us here): the stream's loop waited for the chunk, and the event loop had a turn meanwhile
WAITED_MS = 0.05


class ReadTurns:
    """A stream's loop, behind on its upstream, gives the event loop a turn every :data:`READ_TURN_MS`.

    Chunks already in a buffer (aiohttp's, an h2 call's) come without a wait, and a write the client's
    transport takes at once does not wait either: nothing hands the loop a turn, so nothing reads the
    upstream socket. Its receive buffer fills, the kernel closes the TCP window and the upstream's
    next bytes wait in its send buffer; the kernel's stamp of their arrival (:mod:`pathprobe.rxstamp`)
    then dates the gateway's own lateness, which the split booked as the link's network (2048-token
    streams on loopback through http-proxy: the server's last packet left up to 6.4 ms, p90, after its
    last timestamp, the server link 7.7 ms at the p90). A turn reads what came meanwhile, so the bytes
    are stamped as they come, up to the buffer's own limit (aiohttp's: twice ``read_bufsize``)."""

    __slots__ = ("_at", "_done")

    def __init__(self) -> None:
        self._at = self._done = now_ms()

    async def after(self, had: float, done: float) -> None:
        """A chunk the loop had at ``had`` and handed on by ``done`` (``now_ms()``): a turn of the event loop
        if the last one was :data:`READ_TURN_MS` ago. A chunk that came later than :data:`WAITED_MS` after
        the last was handed on was waited for: the loop had its turn then (a stream that keeps up, its
        chunks apart, takes none of its own)."""
        if had - self._done > WAITED_MS:
            self._at = had
        self._done = done
        if done - self._at > READ_TURN_MS:
            self._at = done
            await asyncio.sleep(0)


def run_aiohttp(
    app_factory: Callable[[], Awaitable[web.Application]],
    cfg: GatewayConfig,
    pool: Pool,
    label: str,
    on_cleanup: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Serve an aiohttp app on ``cfg.listen`` (TLS with ``cfg.tls``) until SIGTERM/SIGINT, then drain:
    health 503 for ``cfg.drain_delay_s``, listener closed, in-flight calls get ``cfg.drain_grace_s``."""
    host, port = cfg.listen_host, cfg.listen_port

    async def main() -> None:
        loopwait.install()  # gw.wait: each request's wait for this loop before its first timestamp
        app = await app_factory()
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=cfg.drain_grace_s)
        await runner.setup()
        ssl_ctx = cfg.tls.server_context(alpn=("http/1.1",)) if cfg.tls else None
        site = web.TCPSite(runner, host, port, reuse_port=True, ssl_context=ssl_ctx)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        print(f"pathprobe gateway: {label} listening on {host}:{bound}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        pool.draining = True
        log.warning(
            "draining: health 503; listener closes in %.1f s, in-flight calls get %.1f s",
            cfg.drain_delay_s,
            cfg.drain_grace_s,
        )
        if cfg.drain_delay_s > 0:
            await asyncio.sleep(cfg.drain_delay_s)
        await runner.cleanup()
        if on_cleanup is not None:
            await on_cleanup()

    asyncio.run(main())
    return 0


def retry_after_of(exc: object = None, metadata: Iterable[tuple[str, str | bytes]] | None = None) -> str | None:
    """``Retry-After`` from our own refusal (``retry_after_ms``) or an upstream's gRPC pushback."""
    ms = getattr(exc, "retry_after_ms", None)
    if ms is None:
        for k, v in metadata or ():
            if k == PUSHBACK_KEY:
                try:
                    ms = float(v)
                except (TypeError, ValueError):
                    ms = None
    return retry_after_header(ms) if ms is not None else None
