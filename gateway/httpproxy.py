"""``http-proxy``: HTTP in, HTTP out over a keep-alive pool, no transcoding.

The baseline for the HTTP side. Any method and path is forwarded (native and
OpenAI-compatible routes alike). ``Server-Timing`` is forwarded with ``gw.*`` appended;
for SSE streams the event that carries ``server_timing`` is re-written with the gateway's
entries appended (its parse and re-dump are the only ``gw.decode`` / ``gw.encode``).
The waits for the client's transport to take each event before that one are ``gw.send`` (the
client link's stack time) as far as they held the stream's end back, i.e. lay after the upstream's
timed event arrived (:mod:`pathprobe.gateway.streamwork`: it reads each event's ``emit_ms`` for
that); the rest overlapped the upstream producing the next event and stays inside ``gw.upstream``.

While it works through events it is behind on, the stream's loop gives the event loop a turn every
ms (:class:`pathprobe.gateway.aio.ReadTurns`), so the upstream socket is read, and its bytes stamped,
as they come.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping

import aiohttp
import grpc
from aiohttp import web
from pathprobe import loopwait, rxstamp, timing
from pathprobe.deadline import TIMEOUT_HEADER, parse_timeout
from pathprobe.errors import PathprobeError, PayloadTooLarge
from pathprobe.gateway import httpup
from pathprobe.gateway.aio import ReadTurns, Spans, json_error, retry_after_of, run_aiohttp
from pathprobe.gateway.common import HOP_BY_HOP, Entries, error_event, upstream_credentials
from pathprobe.gateway.config import GatewayConfig
from pathprobe.gateway.httpup import SEND_SLACK_MS, SessionOwner, UpstreamResponse, body_error
from pathprobe.gateway.metrics import Metrics
from pathprobe.gateway.streamwork import StreamWork
from pathprobe.gateway.upstreams import Pool
from pathprobe.timing import now_ms

#: paths any caller may read through the proxy (the upstream's probes and metrics)
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
#: an SSE event's emit offset (pathprobe servers put one on every chunk)
_EMIT = re.compile(rb'"emit_ms":\s*([0-9]+(?:\.[0-9]+)?)')
_FWD = re.compile(rb'"fwd_ms":\s*([0-9]+(?:\.[0-9]+)?)')


def _req_headers(h: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in h.items() if k.lower() not in HOP_BY_HOP}


class HttpProxy(SessionOwner):
    def __init__(self, cfg: GatewayConfig, pool: Pool, metrics: Metrics, tracing: bool) -> None:
        super().__init__()
        self.cfg = cfg
        self.pool = pool
        self.metrics = metrics
        self.tracing = tracing
        self.connects = httpup.ConnectTimes()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        t0 = now_ms()
        ent = Entries()
        ent.wait = loopwait.wait_ms(loopwait.floor_of(request.transport), t0)
        route = f"{request.method} {request.path}"
        spans = Spans(
            self.tracing,
            route,
            request.headers,
            {
                "http.request.method": request.method,
                "url.path": request.path,
                "network.protocol.name": "http",
                "server.port": self.cfg.listen_port,
                "pathprobe.gateway.mode": "http-proxy",
            },
            t0,
        )
        if ent.wait:  # before t0: the request waited for the gateway's loop
            spans.child("gw.wait", t0 - ent.wait, ent.wait)
        up = None
        status = 0
        try:
            if request.path not in OPEN_PATHS:
                self.cfg.auth.check_mapping(request.headers)
            if request.content_length is not None and request.content_length > self.cfg.max_body_bytes:
                raise PayloadTooLarge(
                    f"body: {request.content_length} bytes is over the gateway's limit of {self.cfg.max_body_bytes} "
                    "bytes (--max-body-bytes)"
                )
            try:
                body = await request.read() if request.body_exists else None
            except web.HTTPRequestEntityTooLarge:
                raise PayloadTooLarge(
                    f"body: over the gateway's limit of {self.cfg.max_body_bytes} bytes (--max-body-bytes)"
                ) from None
            up = await request_(self, request, body, spans)
            resp = up.resp
            status = resp.status
            headers = {
                k: v
                for k, v in resp.headers.items()
                if k.lower() not in HOP_BY_HOP and k.lower() != timing.HTTP_HEADER.lower()
            }
            upstream_st = ", ".join(resp.headers.getall(timing.HTTP_HEADER, [])) or None
            if resp.content_type == "text/event-stream":
                return await self._stream(request, up, headers, t0, ent, spans)
            fd = up.socket_fd()
            try:
                data = await resp.read()
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise body_error(up.upstream, exc, self.cfg.timeout) from None
            t_up1 = now_ms()
            ent.upstream = t_up1 - up.t0
            ent.upwait = loopwait.read_wait_ms(fd, up.t0, t_up1)  # the answer in, the loop busy: our queueing
            spans.upwait(ent.upwait, t_up1)
            Spans.end_client(up.cspan, {"http.response.status_code": status}, None, up.t0, ent.upstream)
            ent.connect = self.connects.get(up.upstream.target)
            ent.total = now_ms() - t0
            headers[timing.HTTP_HEADER] = ent.sent = timing.append(upstream_st, ent.as_dict())
            self.metrics.observe(route, str(status), ent.total, up.upstream.target, ent.upstream)
            spans.end({"http.response.status_code": status}, None, ent.total, ent.sent)
            return web.Response(status=status, body=data, headers=headers)
        except PathprobeError as exc:
            ent.total = now_ms() - t0
            self.metrics.observe(
                route, str(exc.http_status), ent.total, up.upstream.target if up else None, ent.upstream
            )
            r = json_error(
                exc.grpc_code,
                exc.message,
                ent.as_dict(),
                status=exc.http_status,
                param=getattr(exc, "field", None),
                retry_after=retry_after_of(exc),
            )
            spans.end(
                {"http.response.status_code": exc.http_status},
                exc.message,
                ent.total,
                r.headers.get(timing.HTTP_HEADER),
            )
            return r
        finally:
            if up is not None:
                up.resp.release()
                self.pool.release(up.upstream)

    async def _stream(
        self, request: web.Request, up: UpstreamResponse, headers: dict[str, str], t0: float, ent: Entries, spans: Spans
    ) -> web.StreamResponse:
        out = web.StreamResponse(status=up.resp.status, headers=headers)
        await out.prepare(request)
        status = up.resp.status
        try:
            event: list[bytes] = []
            work = StreamWork()
            stamped = up.stamped()  # when each chunk's bytes reached the host, whatever the loop was doing
            ent.upwait = up.send_wait(stamped)
            spans.upwait(ent.upwait, up.t0 + SEND_SLACK_MS + ent.upwait)
            turns = ReadTurns()
            try:
                async for line in up.resp.content:
                    event.append(line)
                    if line not in (b"\n", b"\r\n"):
                        continue
                    data = b"".join(event)
                    event = []
                    if not data.startswith(b"data:"):
                        await out.write(data)
                        continue
                    td = now_ms()
                    work.chunk(td, _offset(_EMIT, data), _offset(_FWD, data), rxstamp.arrived_ms(stamped))
                    if b'"server_timing"' in data or _final_usage(data):
                        data = self._rewrite(data, up, t0, ent, spans, work)
                    await out.write(data)
                    t = now_ms()
                    work.send.append((td, t))
                    await turns.after(td, t)
            except (TimeoutError, aiohttp.ClientError) as exc:
                err = body_error(up.upstream, exc, self.cfg.timeout)
                code = getattr(err, "grpc_code", grpc.StatusCode.UNAVAILABLE)
                await out.write(error_event(code, str(err), getattr(err, "http_status", 503)))
                status = getattr(err, "http_status", 503)
            if event:
                await out.write(b"".join(event))
            await out.write_eof()
        except ConnectionResetError:
            status = 499  # client went away; the upstream response is closed in handle()
            up.resp.close()
        finally:
            if ent.upstream == 0:
                ent.upstream = now_ms() - up.t0
            if ent.total == 0:
                ent.total = now_ms() - t0
            Spans.end_client(up.cspan, {"http.response.status_code": up.resp.status}, None, up.t0, ent.upstream)
            self.metrics.observe(
                f"{request.method} {request.path} stream", str(status), ent.total, up.upstream.target, ent.upstream
            )
            spans.end({"http.response.status_code": status}, None, ent.total, ent.sent)
        return out

    def _rewrite(
        self, data: bytes, up: UpstreamResponse, t0: float, ent: Entries, spans: Spans, work: StreamWork
    ) -> bytes:
        td = now_ms()
        try:
            obj = json.loads(data[5:])
        except ValueError:
            return data
        t1 = now_ms()
        ent.decode += t1 - td
        # the upstream's last timed event: its work is done (this parse is ours); of the hand-offs of
        # the events before it, those after this one arrived held the stream back (gw.send)
        _, _, ent.send, ent.backlog = work.held(up.t0 + timing.own_ms(obj.get("server_timing")))
        ent.upstream = td - up.t0 - ent.send - ent.backlog
        ent.connect = self.connects.get(up.upstream.target)
        ent.total = now_ms() - t0
        obj["server_timing"] = ent.sent = timing.append(obj.get("server_timing"), ent.as_dict())
        out = b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
        ent.encode += now_ms() - t1  # after gw.total: in metrics, not in what was sent
        spans.child("gw.decode", td, t1 - td)
        if ent.send:  # the hand-offs that held the stream back, shown as one interval before this one
            spans.child("gw.send", td - ent.send, ent.send)
        return out


def _offset(pattern: re.Pattern[bytes], data: bytes) -> float | None:
    """An event's ``emit_ms`` (the server's emit offset) or ``fwd_ms`` (a rebuilding gateway's
    hand-off), read without parsing the event."""
    m = pattern.search(data)
    return float(m.group(1)) if m else None


def _final_usage(data: bytes) -> bool:
    """An OpenAI stream's usage chunk (no choices): where a server that sends no ``server_timing``
    (vLLM) ends its stream, so the gateway's own entries ride on it."""
    return b'"usage"' in data and (b'"choices":[]' in data or b'"choices": []' in data)


async def request_(proxy: HttpProxy, request: web.Request, body: bytes | None, spans: Spans) -> UpstreamResponse:
    headers = dict(upstream_credentials(list(_req_headers(request.headers).items()), proxy.cfg.upstream_authorization))
    caller = parse_timeout(request.headers.get(TIMEOUT_HEADER))  # forwarded as is; also bounds our wait
    timeout = min(caller, proxy.cfg.timeout) if caller else proxy.cfg.timeout
    return await httpup.request(
        proxy.session,
        proxy.pool,
        request.method,
        request.path_qs,
        headers,
        body,
        timeout,
        spans,
        proxy.cfg.upstream_scheme,
    )


def serve(cfg: GatewayConfig, pool: Pool, metrics: Metrics, tracing: bool) -> int:
    p = HttpProxy(cfg, pool, metrics, tracing)

    async def factory() -> web.Application:
        p.open_session(cfg.pool_size, p.connects, cfg.upstream_tls_files)
        # a few TCP handshakes to each upstream before serving, off the event loop: gw.connect is
        # the shortest round trip seen, not one connect that a busy loop stretched
        await asyncio.gather(*(p.connects.probe(u.target) for u in pool.upstreams))
        app = web.Application(client_max_size=cfg.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", p.handle)
        return app

    return run_aiohttp(
        factory, cfg, pool, f"http-proxy -> {cfg.upstream_scheme.upper()} {pool.names()}", p.close_session
    )
