"""``reencode``: gRPC in -> protobuf decoded -> JSON -> the server's HTTP ``/v1/generate``.

The "JSON re-encoding inside the gateway" path: every request and response is decoded
and re-encoded twice. ``gw.decode`` = protobuf request parse + upstream JSON parse,
``gw.encode`` = JSON request dump + protobuf response serialize. Upstream ``srv.*`` come
from the ``Server-Timing`` header (unary) or the last SSE event's ``server_timing``.

Streams: chunks are transcoded while the upstream call is open, and grpc.aio resumes the handler
after each chunk it yields once the client's transport has taken the message. The part of that
work after the upstream's last chunk arrived held the stream's end back and is the gateway's
(``gw.decode`` / ``gw.encode``) or its client link's (``gw.send``); the rest overlapped the
upstream producing its next chunk and stays inside ``gw.upstream``
(:mod:`pathprobe.gateway.streamwork`, the server's rule for ``srv.send``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import aiohttp
import grpc
import grpc.aio
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from pathprobe import grpcwait, loopwait, rxstamp, timing
from pathprobe.deadline import PUSHBACK_KEY, RETRY_AFTER, TIMEOUT_HEADER, format_timeout
from pathprobe.errors import DeadlineExceeded, PathprobeError, Unavailable, http_to_grpc
from pathprobe.gateway.aio import Spans
from pathprobe.gateway.common import Entries, forward_metadata, grpc_timeout, upstream_credentials
from pathprobe.gateway.config import GatewayConfig
from pathprobe.gateway.httpup import SEND_SLACK_MS, SessionOwner, UpstreamResponse, body_error, request
from pathprobe.gateway.metrics import Metrics
from pathprobe.gateway.streamwork import StreamWork, chunk_spans
from pathprobe.gateway.upstreams import Pool
from pathprobe.jsontypes import JsonObject
from pathprobe.timing import now_ms
from pathprobe.tls import add_port
from pathprobe.v1 import llm_pb2

log = logging.getLogger("pathprobe.gateway")

GENERATE = "/pathprobe.v1.LLM/Generate"
GENERATE_STREAM = "/pathprobe.v1.LLM/GenerateStream"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def request_to_json(req: llm_pb2.GenerateRequest) -> JsonObject:
    """Set fields only, with their native JSON types (int64 stays a number)."""
    out: JsonObject = {}
    for fd, value in req.ListFields():
        out[fd.name] = list(value) if fd.is_repeated else value
    return out


class _Abort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, retry_after_ms: float | None = None) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.retry_after_ms = retry_after_ms


def _fault(exc: _Abort | PathprobeError) -> tuple[grpc.StatusCode, str, float | None]:
    """(status, details, retry hint) of a call that failed at the gateway or upstream."""
    if isinstance(exc, _Abort):
        return exc.code, exc.details, exc.retry_after_ms
    return exc.grpc_code, exc.message, getattr(exc, "retry_after_ms", None)


def _retry_ms(value: str | None) -> float | None:
    """``Retry-After`` seconds (the delay form) as ms; an HTTP date is not used."""
    try:
        return float(value) * 1000.0 if value else None
    except ValueError:
        return None


def _error_of(status: int, body: bytes, target: str, retry_after: str | None = None) -> _Abort:
    try:
        err = json.loads(body)["error"]
        message = err.get("message") or f"HTTP {status}"
        code = grpc.StatusCode[err["status"]] if err.get("status") in grpc.StatusCode.__members__ else None
    except (ValueError, KeyError, TypeError):
        message, code = body[:200].decode(errors="replace") or f"HTTP {status}", None
    code = code or http_to_grpc(status)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        message = f"upstream {target}: {message}"
    return _Abort(code, message, _retry_ms(retry_after))


class Reencoder(SessionOwner):
    def __init__(self, cfg: GatewayConfig, pool: Pool, metrics: Metrics, tracing: bool) -> None:
        super().__init__()
        self.cfg = cfg
        self.pool = pool
        self.metrics = metrics
        self.tracing = tracing

    def _spans(self, method: str, ctx: grpc.aio.ServicerContext, md: list, t0: float) -> Spans:
        return Spans(
            self.tracing,
            method.lstrip("/"),
            {k: v for k, v in md if isinstance(v, str)},
            {
                "rpc.system": "grpc",
                "rpc.service": "pathprobe.v1.LLM",
                "rpc.method": method.rsplit("/", 1)[1],
                "server.port": self.cfg.listen_port,
                "pathprobe.gateway.mode": "reencode",
            },
            t0,
        )

    def _decode(self, raw: bytes, ent: Entries, spans: Spans, stream: bool) -> bytes:
        td = now_ms()
        try:
            req = llm_pb2.GenerateRequest.FromString(raw)
        except DecodeError as exc:
            raise _Abort(grpc.StatusCode.INVALID_ARGUMENT, f"request: not a valid GenerateRequest ({exc})") from None
        t1 = now_ms()
        obj = request_to_json(req)
        if stream:
            obj["stream"] = True
        body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
        t2 = now_ms()
        ent.decode += t1 - td
        ent.encode += t2 - t1
        spans.child("gw.decode", td, t1 - td)
        spans.child("gw.encode", t1, t2 - t1)
        return body

    def _headers(self, md: list, caller_timeout: float | None = None) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if caller_timeout is not None:  # the caller's remaining time, on to the server (and its engine)
            h[TIMEOUT_HEADER] = format_timeout(caller_timeout)
        for k, v in upstream_credentials(md, self.cfg.upstream_authorization):
            if isinstance(v, str) and (k in ("traceparent", "tracestate", "authorization") or k.startswith("x-")):
                h[k] = v
        return h

    async def _forward(
        self,
        ctx: grpc.aio.ServicerContext,
        md: Any,
        raw: bytes,
        ent: Entries,
        spans: Spans,
        stream: bool,
        timeout: float | None,
    ) -> UpstreamResponse:
        """Check the client's key, re-encode its request as JSON and send it upstream."""
        self.cfg.auth.check_mapping(dict(md))
        body = self._decode(raw, ent, spans, stream)
        return await request(
            self.session,
            self.pool,
            "POST",
            "/v1/generate",
            self._headers(md, grpc_timeout(ctx.time_remaining())),
            body,
            timeout,
            spans,
            self.cfg.upstream_scheme,
        )

    async def _finish_error(
        self,
        ctx: grpc.aio.ServicerContext,
        ent: Entries,
        t0: float,
        spans: Spans,
        code: grpc.StatusCode,
        details: str,
        upstream_st: str | None,
        method: str,
        target: str | None,
        retry_after_ms: float | None = None,
    ) -> NoReturn:
        ent.total = now_ms() - t0
        sent = timing.append(upstream_st, ent.as_dict())
        self.metrics.observe(method, code.name, ent.total, target, ent.upstream)
        if target and code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            self.metrics.upstream_error(target, code.name)
        spans.end({"rpc.grpc.status_code": code.value[0]}, details, ent.total, sent)
        md: tuple[tuple[str, str], ...] = ((timing.METADATA_KEY, sent),)
        if retry_after_ms is not None:
            md += ((PUSHBACK_KEY, str(int(retry_after_ms))),)
        await ctx.abort(code, details, trailing_metadata=md)
        raise AssertionError("grpc's ServicerContext.abort always raises")  # for the type checker

    # -------------------------------------------------------------- unary
    async def generate(self, raw: bytes, ctx: grpc.aio.ServicerContext) -> bytes:
        t0 = now_ms()
        ent = Entries(wait=_held(ctx))
        md = forward_metadata(ctx.invocation_metadata())
        spans = self._spans(GENERATE, ctx, md, t0)
        timeout = grpc_timeout(ctx.time_remaining()) or self.cfg.timeout
        up = None
        upstream_st = None
        try:
            up = await self._forward(ctx, md, raw, ent, spans, False, timeout)
            fd = up.socket_fd()
            try:
                data = await up.resp.read()
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise body_error(up.upstream, exc, timeout) from None
            t_up1 = now_ms()
            ent.upstream = t_up1 - up.t0
            ent.upwait = loopwait.read_wait_ms(fd, up.t0, t_up1)  # the answer in, the loop busy: our queueing
            spans.upwait(ent.upwait, t_up1)
            upstream_st = up.resp.headers.get(timing.HTTP_HEADER)
            Spans.end_client(up.cspan, {"http.response.status_code": up.resp.status}, None, up.t0, ent.upstream)
            if up.resp.status != 200:
                raise _error_of(up.resp.status, data, up.upstream.target, up.resp.headers.get(RETRY_AFTER))
            td = now_ms()
            msg = llm_pb2.GenerateResponse()
            json_format.ParseDict(json.loads(data), msg, ignore_unknown_fields=True)
            t1 = now_ms()
            out = msg.SerializeToString()
            t2 = now_ms()
            ent.decode += t1 - td
            ent.encode += t2 - t1
            spans.child("gw.decode", td, t1 - td)
            spans.child("gw.encode", t1, t2 - t1)
        except (_Abort, PathprobeError) as exc:
            code, details, retry_after_ms = _fault(exc)
            target = up.upstream.target if up else None
            await self._finish_error(ctx, ent, t0, spans, code, details, upstream_st, GENERATE, target, retry_after_ms)
        finally:
            if up is not None:
                up.resp.release()
                self.pool.release(up.upstream)
        ent.total = now_ms() - t0
        sent = timing.append(upstream_st, ent.as_dict())
        ctx.set_trailing_metadata(((timing.METADATA_KEY, sent),))
        self.metrics.observe(GENERATE, "OK", ent.total, up.upstream.target, ent.upstream)
        spans.end({"rpc.grpc.status_code": 0}, None, ent.total, sent)
        return out

    # -------------------------------------------------------------- streaming
    async def generate_stream(self, raw: bytes, ctx: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        t0 = now_ms()
        ent = Entries(wait=_held(ctx))
        md = forward_metadata(ctx.invocation_metadata())
        spans = self._spans(GENERATE_STREAM, ctx, md, t0)
        timeout = grpc_timeout(ctx.time_remaining()) or self.cfg.timeout
        up = None
        upstream_st = None
        ok = False
        c_dec = c_enc = c_send = c_back = 0.0
        work = StreamWork()
        try:
            up = await self._forward(ctx, md, raw, ent, spans, True, timeout)
            if up.resp.status != 200:
                data = await up.resp.read()
                ent.upstream = now_ms() - up.t0
                upstream_st = up.resp.headers.get(timing.HTTP_HEADER)
                Spans.end_client(up.cspan, {"http.response.status_code": up.resp.status}, "error", up.t0, ent.upstream)
                raise _error_of(up.resp.status, data, up.upstream.target, up.resp.headers.get(RETRY_AFTER))
            stamped = up.stamped()  # when each chunk's bytes reached the host, whatever the loop was doing
            ent.upwait = up.send_wait(stamped)
            spans.upwait(ent.upwait, up.t0 + SEND_SLACK_MS + ent.upwait)
            try:
                async for line in up.resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        break
                    td = now_ms()
                    try:
                        obj = json.loads(payload)
                        emit, fwd = obj.get("emit_ms"), obj.get("fwd_ms")
                        work.chunk(td, _offset(emit), _offset(fwd), rxstamp.arrived_ms(stamped))
                        st = obj.pop("server_timing", None)
                        if st is not None:
                            upstream_st = st
                        if "error" in obj:
                            err = obj["error"]
                            status = err.get("code", 500) if isinstance(err.get("code"), int) else 500
                            raise _error_of(status, json.dumps({"error": err}).encode(), up.upstream.target)
                        chunk = llm_pb2.GenerateChunk()
                        json_format.ParseDict(obj, chunk, ignore_unknown_fields=True)
                    finally:
                        t1 = now_ms()
                        work.decode.append((td, t1))
                    chunk.fwd_ms = round(t1 - t0, 3)  # our hand-off paces the client's chunks
                    out = chunk.SerializeToString()
                    ts = now_ms()
                    work.encode.append((t1, ts))
                    yield out
                    work.send.append((ts, now_ms()))
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise body_error(up.upstream, exc, timeout) from None
            finally:
                # Chunks are transcoded and handed to the client's transport while the upstream call
                # is open; only the part of that work after the upstream's last chunk arrived held
                # the stream back (gw.decode / gw.encode / gw.send, taken out of gw.upstream so no
                # segment counts it twice): pathprobe.gateway.streamwork
                t_up1 = now_ms()  # what held() costs is the gateway's own, not the link's
                c_dec, c_enc, c_send, c_back = work.held(up.t0 + timing.own_ms(upstream_st))
                ent.upstream = t_up1 - up.t0 - c_dec - c_enc - c_send - c_back
                ent.decode += c_dec
                ent.encode += c_enc
                ent.send = c_send
                ent.backlog = c_back
            Spans.end_client(up.cspan, {"http.response.status_code": 200}, None, up.t0, ent.upstream)
            ok = True
        except (_Abort, PathprobeError) as exc:
            code, details, retry_after_ms = _fault(exc)
            target = up.upstream.target if up else None
            await self._finish_error(
                ctx, ent, t0, spans, code, details, upstream_st, GENERATE_STREAM, target, retry_after_ms
            )
        finally:
            if up is not None:
                if ok:
                    up.resp.release()
                else:
                    up.resp.close()  # a half-read stream: drop the connection, the server frees the slot
                self.pool.release(up.upstream)
                if spans.server is not None:
                    chunk_spans(spans, work, (c_dec, c_enc, c_send, c_back))
                    if up.cspan is not None and up.cspan.is_recording():  # ended early (error, client gone)
                        Spans.end_client(up.cspan, {}, "upstream stream not completed", up.t0, ent.upstream)
                    if not ok and spans.server.is_recording():  # the client went away
                        spans.end({"rpc.grpc.status_code": 1}, "cancelled", now_ms() - t0)
        ent.total = now_ms() - t0
        sent = timing.append(upstream_st, ent.as_dict())
        ctx.set_trailing_metadata(((timing.METADATA_KEY, sent),))
        self.metrics.observe(GENERATE_STREAM, "OK", ent.total, up.upstream.target, ent.upstream)
        spans.end({"rpc.grpc.status_code": 0}, None, ent.total, sent)

    async def health(self, raw: bytes, ctx: grpc.aio.ServicerContext) -> bytes:
        from grpc_health.v1 import health_pb2

        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.pool.any_healthy() and not self.pool.draining
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        return health_pb2.HealthCheckResponse(status=status).SerializeToString()


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, r: Reencoder) -> None:
        self.handlers = {
            GENERATE: grpc.unary_unary_rpc_method_handler(r.generate),
            GENERATE_STREAM: grpc.unary_stream_rpc_method_handler(r.generate_stream),
            HEALTH_CHECK: grpc.unary_unary_rpc_method_handler(r.health),
        }

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.handlers.get(details.method)  # None -> UNIMPLEMENTED


def serve(cfg: GatewayConfig, pool: Pool, metrics: Metrics, tracing: bool) -> int:
    r = Reencoder(cfg, pool, metrics, tracing)

    async def main() -> None:
        # the loop's sleeps and its sockets' readiness: gw.upwait, and whether a gap between an upstream
        # stream's chunks was a wait for them (pathprobe.gateway.streamwork)
        loopwait.install()
        r.open_session(cfg.pool_size, tls=cfg.upstream_tls_files)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", cfg.max_body_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 1),
            ]
        )
        server.add_generic_rpc_handlers((_Handler(r),))
        bound = add_port(server, f"{cfg.listen_host}:{cfg.listen_port}", cfg.tls)
        if not bound:
            raise Unavailable(f"--listen: cannot bind {cfg.listen}")
        await server.start()
        print(
            f"pathprobe gateway: reencode listening on {cfg.listen_host}:{bound} -> "
            f"{cfg.upstream_scheme.upper()} {pool.names()}",
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        pool.draining = True
        if cfg.drain_delay_s > 0:
            await asyncio.sleep(cfg.drain_delay_s)
        await server.stop(cfg.drain_grace_s)  # new calls refused, in-flight ones waited for
        await r.close_session()

    asyncio.run(main())
    return 0


__all__ = ["DeadlineExceeded", "serve"]


def _offset(value: object) -> float | None:
    """An event's ``emit_ms`` / ``fwd_ms``, when it is a number."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _held(ctx: grpc.aio.ServicerContext) -> float | None:
    """How long grpc.aio held the call before this handler ran (``gw.wait``; :mod:`pathprobe.grpcwait`)."""
    return grpcwait.wait_ms(grpcwait.declared_ms(ctx.invocation_metadata()), ctx.time_remaining())
