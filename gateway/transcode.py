"""``transcode``: the server's native HTTP/JSON routes in front of its gRPC port.

``POST /v1/generate`` (SSE when ``"stream": true``) and ``GET /healthz``, so a client
switches between server and gateway by changing only the address. JSON -> protobuf with
:mod:`pathprobe.jsoncodec` (proto field names), gRPC status -> HTTP as grpc-gateway and
Envoy map it (:data:`pathprobe.errors.GRPC_TO_HTTP`). Timing: ``gw.decode`` = JSON parse
+ message build + upstream response parse, ``gw.encode`` = request serialize + response
JSON; upstream ``srv.*`` entries come from the call's trailing metadata. The upstream calls go
through :mod:`pathprobe.gateway.grpcup` (not grpc.aio): its sockets are the loop's and stamped, so
an answer the gateway reads late is its ``gw.upwait`` / ``gw.backlog``, not the server link's network.

Streams: chunks are transcoded and handed to the client's transport (``resp.prepare`` /
``resp.write``) while the upstream call is open. The part of that work after the upstream's last
chunk arrived held the stream's end back and is the gateway's (``gw.decode`` / ``gw.encode``) or
its client link's (``gw.send``); the rest overlapped the upstream producing its next chunk and
stays inside ``gw.upstream`` (:mod:`pathprobe.gateway.streamwork`, the server's rule for
``srv.send``). The last chunk waits for the trailers and goes out after ``gw.total``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import grpc
import grpc.aio
from aiohttp import web
from pathprobe import jsoncodec, loopwait, timing
from pathprobe.address import host_and_port
from pathprobe.deadline import TIMEOUT_HEADER, parse_timeout
from pathprobe.errors import InvalidArgument, PathprobeError, PayloadTooLarge
from pathprobe.gateway import grpcup
from pathprobe.gateway.aio import ReadTurns, Spans, json_error, retry_after_of, run_aiohttp
from pathprobe.gateway.common import Entries, client_credentials, error_event, upstream_credentials
from pathprobe.gateway.config import GatewayConfig
from pathprobe.gateway.metrics import Metrics
from pathprobe.gateway.passthrough import connect_failure
from pathprobe.gateway.streamwork import StreamWork, chunk_spans
from pathprobe.gateway.upstreams import Pool, Upstream
from pathprobe.jsontypes import JsonObject
from pathprobe.timing import now_ms
from pathprobe.v1 import llm_pb2

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from opentelemetry.util.types import AttributeValue

log = logging.getLogger("pathprobe.gateway")

GENERATE = "/pathprobe.v1.LLM/Generate"
GENERATE_STREAM = "/pathprobe.v1.LLM/GenerateStream"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}
SSE_DONE = b"data: [DONE]\n\n"


class _Call:
    """One ``POST /v1/generate`` read and encoded, ready to go upstream."""

    __slots__ = ("creds", "enc", "ent", "payload", "spans", "t0", "te", "timeout")

    def __init__(
        self,
        payload: bytes,
        t0: float,
        ent: Entries,
        spans: Spans,
        te: float,
        enc: float,
        creds: list[tuple[str, str]],
        timeout: float,
    ) -> None:
        self.payload = payload  # the serialized GenerateRequest
        self.t0 = t0  # the request's arrival
        self.ent = ent  # the gateway's timing entries so far
        self.spans = spans
        self.te = te  # when the request's encoding started, and how long it took (its span)
        self.enc = enc
        self.creds = creds  # the metadata that carries credentials upstream
        self.timeout = timeout


def _upstream_timing(md: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    values = [v if isinstance(v, str) else v.decode() for k, v in (md or ()) if k == timing.METADATA_KEY]
    return ", ".join(values) if values else None


def _stream_end(t_up0: float, upstream_st: str | None, call: grpcup.Call) -> float:
    """The earliest a stream's end can be (:meth:`StreamWork.held`'s bound), whether it ended well or
    failed: not before the server sent its trailers, after its wait and its whole total, last hand-off
    included (``timing.finished_ms``; ``t_up0`` when they carry no timing), nor before they reached us
    (a server can send them after its last message, grpc.aio's does when it is busy). The gateway's
    work before that overlapped them."""
    finished = t_up0 + timing.finished_ms(upstream_st)
    return max(finished, call.ended_ms or finished)


class Transcoder:
    def __init__(self, cfg: GatewayConfig, pool: Pool, metrics: Metrics, tracing: bool) -> None:
        self.cfg = cfg
        self.pool = pool
        self.metrics = metrics
        self.tracing = tracing

    def start_clients(self) -> None:
        for u in self.pool.upstreams:
            u.client = grpcup.Channel(u.target, self.cfg.upstream_tls_files, self.cfg.pool_size)

    async def close(self) -> None:
        for u in self.pool.upstreams:
            if u.client is not None:
                await u.client.close()

    # ---------------------------------------------------------------- routes
    async def healthz(self, request: web.Request) -> web.Response:
        ok = self.pool.any_healthy() and not self.pool.draining
        return web.json_response(
            {
                "status": "draining" if self.pool.draining else "ok" if ok else "unavailable",
                "upstreams": {u.target: u.healthy for u in self.pool.upstreams},
            },
            status=200 if ok else 503,
        )

    async def not_found(self, request: web.Request) -> web.Response:
        return json_error(
            grpc.StatusCode.UNIMPLEMENTED, f"path: no route {request.method} {request.path}", status=404, param="path"
        )

    async def generate(self, request: web.Request) -> web.StreamResponse:
        t0 = now_ms()
        ent = Entries()
        ent.wait = loopwait.wait_ms(loopwait.floor_of(request.transport), t0)
        spans = Spans(
            self.tracing,
            "POST /v1/generate",
            request.headers,
            {
                "http.request.method": "POST",
                "url.path": request.path,
                "http.route": "/v1/generate",
                "network.protocol.name": "http",
                "server.port": self.cfg.listen_port,
                "pathprobe.gateway.mode": "transcode",
            },
            t0,
        )
        if ent.wait:  # before t0: the request waited for the gateway's loop
            spans.child("gw.wait", t0 - ent.wait, ent.wait)
        try:
            self.cfg.auth.check_mapping(request.headers)
            creds = upstream_credentials(client_credentials(request.headers), self.cfg.upstream_authorization)
            # the caller's deadline (grpc-timeout header) becomes the upstream call's, capped by --timeout
            caller = parse_timeout(request.headers.get(TIMEOUT_HEADER))
            timeout = min(caller, self.cfg.timeout) if caller else self.cfg.timeout
            if request.content_length is not None and request.content_length > self.cfg.max_body_bytes:
                raise PayloadTooLarge(
                    f"body: {request.content_length} bytes is over the gateway's limit of {self.cfg.max_body_bytes} "
                    "bytes (--max-body-bytes)"
                )
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise PayloadTooLarge(
                    f"body: over the gateway's limit of {self.cfg.max_body_bytes} bytes (--max-body-bytes)"
                ) from None
            td = now_ms()
            obj = jsoncodec.loads_object(body)
            req = jsoncodec.request_from_dict(obj)
            stream = jsoncodec.stream_flag(obj)
            ent.decode = now_ms() - td
            spans.child("gw.decode", td, ent.decode)
            te = now_ms()
            payload = req.SerializeToString()
            enc = now_ms() - te
            ent.encode += enc
        except PathprobeError as exc:
            ent.total = now_ms() - t0
            self.metrics.observe("POST /v1/generate", str(exc.http_status), ent.total, None, 0)
            sent = timing.format_entries(ent.as_dict())
            spans.end({"http.response.status_code": exc.http_status}, exc.message, ent.total, sent)
            return json_error(
                exc.grpc_code,
                exc.message,
                status=exc.http_status,
                param=getattr(exc, "field", None),
                server_timing=sent,
            )
        call = _Call(payload, t0, ent, spans, te, enc, creds, timeout)
        if stream:
            return await self._stream(request, call)
        return await self._unary(call)

    def _refused(self, exc: PathprobeError, route: str, t0: float, ent: Entries, spans: Spans) -> web.Response:
        """No upstream taken (none healthy: 503; all at the in-flight cap: 429 + Retry-After), with
        the gateway's own timing so far; counted like every other answer."""
        ent.total = now_ms() - t0
        r = json_error(
            exc.grpc_code, exc.message, ent.as_dict(), status=exc.http_status, retry_after=retry_after_of(exc)
        )
        self.metrics.observe(route, str(exc.http_status), ent.total, None, 0)
        spans.end(
            {"http.response.status_code": exc.http_status}, exc.message, ent.total, r.headers.get(timing.HTTP_HEADER)
        )
        return r

    # ---------------------------------------------------------------- upstream
    async def _call(
        self, kind: str, payload: bytes, spans: Spans, creds: list[tuple[str, str]], timeout: float
    ) -> tuple[Upstream, grpcup.Call, Span | None, float, dict[str, AttributeValue]]:
        """Start the call; a refused connection fails over to another upstream."""
        tried: tuple[Upstream, ...] = ()
        while True:
            u = self.pool.acquire(tried)
            method = GENERATE_STREAM if kind == "stream" else GENERATE
            host, port = host_and_port(u.target)
            cattrs: dict[str, AttributeValue] = {
                "rpc.system": "grpc",
                "rpc.service": "pathprobe.v1.LLM",
                "rpc.method": method.rsplit("/", 1)[1],
                "server.address": host,
                "server.port": port,
            }
            t_up0 = now_ms()
            cspan, carrier = spans.client(method.lstrip("/"), cattrs, t_up0)
            md: list[tuple[str, str | bytes]] = [*carrier.items(), *creds]
            call = await u.client.call(method, payload, timeout, md)  # the timeout sent is declared
            failed = call.failure()
            if failed is not None and len(self.pool.upstreams) > 1 and connect_failure(failed.details()):
                self.pool.release(u)
                u.mark(False, failed.details() or "connect failed")
                Spans.end_client(cspan, {"rpc.grpc.status_code": 14}, "connect failed", t_up0, now_ms() - t_up0)
                tried += (u,)
                if len(tried) < len(self.pool.upstreams):
                    continue
            return u, call, cspan, t_up0, cattrs

    def _error(self, err: grpc.aio.AioRpcError, u: Upstream) -> tuple[grpc.StatusCode, str]:
        code, details = err.code(), err.details() or ""
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            details = f"upstream {u.target}: {details}"
            if code is grpc.StatusCode.UNAVAILABLE and not err.trailing_metadata():
                u.mark(False, details)
            self.metrics.upstream_error(u.target, code.name)
        return code, details

    async def _begin(
        self, kind: str, route: str, c: _Call
    ) -> tuple[Upstream, grpcup.Call, Span | None, float] | web.Response:
        """Open the upstream call (upstream, call, CLIENT span, its start), or the refusal to answer."""
        try:
            u, call, cspan, t_up0, _cattrs = await self._call(kind, c.payload, c.spans, c.creds, c.timeout)
        except PathprobeError as exc:  # no healthy upstream, or every one at --max-inflight
            return self._refused(exc, route, c.t0, c.ent, c.spans)
        c.spans.child("gw.encode", c.te, c.enc)
        return u, call, cspan, t_up0

    async def _unary(self, c: _Call) -> web.Response:
        begun = await self._begin("unary", "POST /v1/generate", c)
        if isinstance(begun, web.Response):
            return begun
        u, call, cspan, t_up0 = begun
        t0, ent, spans = c.t0, c.ent, c.spans
        try:
            try:
                raw = await call
            except grpc.aio.AioRpcError as err:
                ent.upstream = now_ms() - t_up0
                code, details = self._error(err, u)
                Spans.end_client(cspan, {"rpc.grpc.status_code": code.value[0]}, details, t_up0, ent.upstream)
                ent.total = now_ms() - t0
                status = json_error(
                    code,
                    details,
                    ent.as_dict(),
                    _upstream_timing(err.trailing_metadata()),
                    retry_after=retry_after_of(metadata=err.trailing_metadata()),
                )
                self.metrics.observe("POST /v1/generate", str(status.status), ent.total, u.target, ent.upstream)
                spans.end(
                    {"http.response.status_code": status.status},
                    details,
                    ent.total,
                    status.headers.get(timing.HTTP_HEADER),
                )
                return status
            t_up1 = now_ms()
            ent.upstream = t_up1 - t_up0
            ent.upwait = grpcup.wait_ms(call, t_up0, t_up1)  # the answer in, the loop busy: our queueing
            spans.upwait(ent.upwait, t_up1)
            upstream_st = _upstream_timing(await call.trailing_metadata())
            Spans.end_client(cspan, {"rpc.grpc.status_code": 0}, None, t_up0, ent.upstream)
            td = now_ms()
            msg = llm_pb2.GenerateResponse.FromString(raw)
            te2 = now_ms()
            ent.decode += te2 - td
            body = jsoncodec.dumps(jsoncodec.to_dict(msg))
            t_end = now_ms()
            ent.encode += t_end - te2
            spans.child("gw.decode", td, te2 - td)
            spans.child("gw.encode", te2, t_end - te2)
        finally:
            if not call.done():
                call.cancel()
            self.pool.release(u)
        ent.total = now_ms() - t0
        sent = timing.append(upstream_st, ent.as_dict())
        self.metrics.observe("POST /v1/generate", "200", ent.total, u.target, ent.upstream)
        spans.end({"http.response.status_code": 200}, None, ent.total, sent)
        return web.Response(body=body, content_type="application/json", headers={timing.HTTP_HEADER: sent})

    async def _stream(self, request: web.Request, c: _Call) -> web.StreamResponse:
        begun = await self._begin("stream", "POST /v1/generate stream", c)
        if isinstance(begun, web.Response):
            return begun
        u, call, cspan, t_up0 = begun
        t0, ent, spans = c.t0, c.ent, c.spans
        resp: web.StreamResponse | None = None
        held: JsonObject | None = None
        status = 200
        # Chunks are transcoded and handed to the client's transport while the upstream call is
        # open; only the part of that work after the upstream's last chunk arrived held the stream
        # back (gw.decode / gw.encode / gw.send, taken out of gw.upstream): pathprobe.gateway.streamwork
        work = StreamWork()
        c_dec = c_enc = c_send = c_back = 0.0
        turns = ReadTurns()
        try:
            try:
                async for raw in call:
                    td = now_ms()
                    chunk = llm_pb2.GenerateChunk.FromString(raw)
                    work.chunk(td, chunk.emit_ms, chunk.fwd_ms, call.arrived_ms)
                    t1 = now_ms()
                    work.decode.append((td, t1))
                    chunk.fwd_ms = round(t1 - t0, 3)  # our hand-off paces the client's chunks
                    obj = jsoncodec.to_dict(chunk)
                    if chunk.finish_reason:
                        work.encode.append((t1, now_ms()))
                        held = obj  # the last chunk waits for the trailers (srv.* timing)
                        continue
                    data = b"data: " + jsoncodec.dumps(obj) + b"\n\n"
                    ts = now_ms()
                    work.encode.append((t1, ts))
                    if resp is None:
                        resp = web.StreamResponse(headers=SSE_HEADERS)
                        await resp.prepare(request)
                    await resp.write(data)
                    t = now_ms()
                    work.send.append((ts, t))
                    await turns.after(td, t)
                upstream_st = _upstream_timing(await call.trailing_metadata())
                t_up1 = now_ms()  # the call is over; what held() costs is the gateway's own, not the link's
                # the last chunk goes out with the trailers' timing: work before they came overlapped them
                c_dec, c_enc, c_send, c_back = work.held(_stream_end(t_up0, upstream_st, call))
                ent.upstream = t_up1 - t_up0 - c_dec - c_enc - c_send - c_back
                # the call's end (its status) in while the loop was busy after the last chunk's work
                ent.upwait = grpcup.wait_ms(call, max(t_up0, work.done()), t_up1)
                spans.upwait(ent.upwait, t_up1)
                ent.decode += c_dec
                ent.encode += c_enc
                Spans.end_client(cspan, {"rpc.grpc.status_code": 0}, None, t_up0, ent.upstream)
                if resp is None:
                    ts = now_ms()
                    resp = web.StreamResponse(headers=SSE_HEADERS)
                    await resp.prepare(request)
                    c_send += now_ms() - ts
                ent.send = c_send
                ent.backlog = c_back
                data = b""
                if held is not None:
                    t1 = now_ms()
                    ent.total = t1 - t0
                    ent.sent = held["server_timing"] = timing.append(upstream_st, ent.as_dict())
                    held["fwd_ms"] = round(t1 - t0, 3)  # handed on only now, after the trailers
                    data = b"data: " + jsoncodec.dumps(held) + b"\n\n"
                    ent.encode += now_ms() - t1  # after gw.total: in metrics, not in what was sent
                # the last event and the [DONE] in one write, as our server's (its consumer dates the
                # last event by the read that returned it: pathprobe.gateway.streamwork)
                await resp.write(data + SSE_DONE)
            except grpc.aio.AioRpcError as err:
                t_up1 = now_ms()
                failed_st = _upstream_timing(err.trailing_metadata())
                c_dec, c_enc, c_send, c_back = work.held(_stream_end(t_up0, failed_st, call))  # as on success
                ent.upstream = t_up1 - t_up0 - c_dec - c_enc - c_send - c_back
                ent.decode += c_dec
                ent.encode += c_enc
                ent.send = c_send
                ent.backlog = c_back
                code, details = self._error(err, u)
                Spans.end_client(cspan, {"rpc.grpc.status_code": code.value[0]}, details, t_up0, ent.upstream)
                ent.total = now_ms() - t0
                upstream_st = failed_st
                status = 200 if resp is not None else 0
                if resp is None:  # nothing sent yet: a real HTTP error status
                    r = json_error(
                        code,
                        details,
                        ent.as_dict(),
                        upstream_st,
                        retry_after=retry_after_of(metadata=err.trailing_metadata()),
                    )
                    status = r.status
                    ent.sent = r.headers.get(timing.HTTP_HEADER)
                    return r
                ent.sent = timing.append(upstream_st, ent.as_dict())
                await resp.write(error_event(code, details, server_timing=ent.sent))
            except ConnectionResetError:
                status = 499  # the client went away: the upstream stream is cancelled below
            except asyncio.CancelledError:
                status = 499
                raise
        finally:
            if not call.done():
                call.cancel()
            self.pool.release(u)
            if ent.total == 0:
                ent.total = now_ms() - t0
            self.metrics.observe("POST /v1/generate stream", str(status), ent.total, u.target, ent.upstream)
            if spans.server is not None:
                chunk_spans(spans, work, (c_dec, c_enc, c_send, c_back))
                if cspan is not None and cspan.is_recording():  # the client went away mid-stream
                    Spans.end_client(cspan, {}, "cancelled", t_up0, now_ms() - t_up0 - c_dec - c_enc - c_send - c_back)
                spans.end({"http.response.status_code": status}, None if status < 400 else "error", ent.total, ent.sent)
        if resp is None:  # the client went away before anything was sent: nobody reads this answer
            return web.Response(status=status)
        return resp


def serve(cfg: GatewayConfig, pool: Pool, metrics: Metrics, tracing: bool) -> int:
    tc = Transcoder(cfg, pool, metrics, tracing)

    async def factory() -> web.Application:
        tc.start_clients()
        app = web.Application(client_max_size=cfg.max_body_bytes)
        app.router.add_post("/v1/generate", tc.generate)
        app.router.add_get("/healthz", tc.healthz)
        app.router.add_route("*", "/{tail:.*}", tc.not_found)
        return app

    return run_aiohttp(
        factory, cfg, pool, f"transcode -> gRPC{'s' if cfg.upstream_tls_files else ''} {pool.names()}", tc.close
    )


__all__ = ["InvalidArgument", "Transcoder", "serve"]
