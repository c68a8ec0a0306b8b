"""gRPC front end (grpc.aio): pathprobe.v1.LLM plus health checking and reflection.

Handlers take and return raw bytes and (de)serialize themselves, so ``srv.decode``
and ``srv.encode`` are measured, not guessed. Every call, failed ones included, ends
with the ``server-timing`` trailing metadata.

A stream's handler yields each chunk to grpc.aio, which resumes it only once the transport
has taken the message (the send op's completion, handed from gRPC's poller thread to the
event loop). While it waits, the engine is producing the next token, so most of that wait
is hidden under the engine's own time; ``srv.send`` is only the part that held the stream's
end back: the waits after the engine's last token was ready (:func:`pathprobe.timing.held_back`; the last
chunk's wait, and a backlog of chunks when the transport is slower than the engine). Counting
every wait would count the overlapped part twice, once in the engine's ``srv.decode_steps``
and once here (a negative "other" where the waits are long and overlapped). It is the gRPC stack's time, not the
handler's; it swings by tenths of a millisecond with what else the machine runs while the
chunks go out (e.g. 0.7 ms vs 1.1 ms for six chunks, whether the receiver's relay and client
work in parallel or not), so the split books it as the link's network (:mod:`pathprobe.segments`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from pathprobe import grpcwait, loopwait, timing
from pathprobe.deadline import PUSHBACK_KEY, deadline_in
from pathprobe.errors import InvalidArgument, PathprobeError, PayloadTooLarge
from pathprobe.server.core import RequestScope, ServerState, params_from_proto
from pathprobe.timing import now_ms
from pathprobe.tls import TlsFiles, add_port
from pathprobe.v1 import llm_pb2

SERVICE = "pathprobe.v1.LLM"
log = logging.getLogger("pathprobe.server")


def _carrier(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def _attributes(method: str, context: grpc.aio.ServicerContext) -> dict[str, object]:
    return {
        "rpc.system": "grpc",
        "rpc.service": SERVICE,
        "rpc.method": method,
        "network.peer.address": context.peer(),
    }


def grpc_receive_cap(max_body_bytes: int) -> int:
    """gRPC's own cap on a received message, above the server's limit (``--max-body-bytes``): a
    message up to the cap reaches the handler, which refuses one over the limit naming it; grpc-core
    refuses one over the cap itself (RESOURCE_EXHAUSTED too, naming the cap's size, not the flag)."""
    return 2 * max_body_bytes + 64 * 1024


def _decode(data: bytes, max_body_bytes: int | None = None) -> tuple[llm_pb2.GenerateRequest, float]:
    if max_body_bytes is not None and len(data) > max_body_bytes:
        raise PayloadTooLarge(
            f"request: a {len(data)}-byte message exceeds the server's limit of {max_body_bytes} bytes "
            "(--max-body-bytes)"
        )
    t0 = now_ms()
    try:
        req = llm_pb2.GenerateRequest.FromString(data)
    except DecodeError as exc:
        raise InvalidArgument("request", f"not a valid pathprobe.v1.GenerateRequest: {exc}") from None
    return req, now_ms() - t0


@dataclass(frozen=True, slots=True)
class _Received:
    """A call's request message as its handler read it (see :meth:`LLMService._received`)."""

    data: bytes
    #: its wait for this front end before ``t0`` (ms; None: not measured)
    wait: float | None
    #: the request's start (``now_ms()``): the handler's, or the message's arrival
    t0: float
    #: the handler's wait for the message's bytes after the headers (ms; 0: it was in; None: not measured,
    #: the loop is not watched)
    body_ms: float | None


class LLMService:
    def __init__(self, state: ServerState, max_body_bytes: int | None = None) -> None:
        self.state = state
        self.max_body_bytes = max_body_bytes

    async def _received(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> _Received:
        """The call's request message and the call's wait for this front end, read at the handler's
        start: grpc.aio held the call from its headers until it ran the handler (the wait, from the
        caller's declared deadline: :mod:`pathprobe.grpcwait`). The methods are served as streaming
        requests (the same on the wire) so that the handler starts at the headers, not once the
        whole message is in. Reading the message then takes either its transfer after the headers
        (a 100 KB prompt behind a slow link crosses in several round trips: the link's time) or,
        when it was already in, the loop's turns to get back to this handler (busy with others: this
        hop's wait). The loop tells which: if it slept meanwhile, the handler was waiting for bytes:
        the request starts at the headers and the read is its ``srv.body`` (inside ``srv.total``, the
        link's: :data:`pathprobe.timing.BODY_PART`); if it never slept (or is not watched), the request
        starts once the message is in and the read is added to the wait, as a unary handler, which
        starts then, would count it."""
        t_handler = now_ms()
        wait = grpcwait.wait_ms(grpcwait.declared_ms(context.invocation_metadata()), context.time_remaining())
        async for data in requests:
            t_read = now_ms()
            body = loopwait.body_wait_ms(t_handler, t_read)
            if body:  # the handler waited for the message's bytes
                return _Received(data, wait, t_handler, body)
            if wait is not None:
                wait += t_read - t_handler
            return _Received(data, wait, t_read, body)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request: the call carried no message")
        raise AssertionError("unreachable")  # abort raises

    def _scope(self, method: str, context: grpc.aio.ServicerContext, got: _Received) -> RequestScope:
        scope = RequestScope(
            self.state,
            f"grpc.{method}",
            _carrier(context),
            f"{SERVICE}/{method}",
            _attributes(method, context),
            t0=got.t0,
            body_ms=got.body_ms,
        )
        scope.deadline_ms = deadline_in(context.time_remaining())
        if got.wait is not None:
            scope.floor_ms = scope.t0 - got.wait
        return scope

    async def _abort(self, scope: RequestScope, context: grpc.aio.ServicerContext, exc: PathprobeError) -> None:
        entries = scope.finish(exc.grpc_code.name, error=exc)
        md: tuple[tuple[str, str], ...] = timing.metadata(entries)
        retry = getattr(exc, "retry_after_ms", None)
        if retry is not None:
            md += ((PUSHBACK_KEY, str(int(retry))),)
        await context.abort(exc.grpc_code, exc.message, trailing_metadata=md)

    async def generate(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        got = await self._received(requests, context)
        data, scope = got.data, self._scope("Generate", context, got)
        try:
            self.state.auth.check_mapping(scope.carrier)
            req, ms = _decode(data, self.max_body_bytes)
            scope.decoded(ms)
            gen = scope.start(params_from_proto(req))
            text, ids = await gen.collect()
            t0 = now_ms()
            resp = llm_pb2.GenerateResponse(
                text=text,
                token_ids=ids,
                finish_reason=gen.finish_reason or "",
                usage=llm_pb2.Usage(
                    prompt_tokens=gen.prompt_tokens,
                    completion_tokens=gen.completion_tokens,
                    cached_tokens=gen.timing.cached_tokens,
                ),
                request_id=req.request_id,
                model=self.state.engine.model_name,
            )
            out = resp.SerializeToString()
            scope.encoded(now_ms() - t0)
        except PathprobeError as exc:
            await self._abort(scope, context, exc)
            raise AssertionError("unreachable") from exc  # abort raises
        except asyncio.CancelledError:  # client cancelled or its deadline passed
            scope.finish("CANCELLED")
            raise
        entries = scope.finish("OK")
        context.set_trailing_metadata(timing.metadata(entries))
        return out

    async def generate_stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        got = await self._received(requests, context)
        data, scope = got.data, self._scope("GenerateStream", context, got)
        gen = None
        try:
            self.state.auth.check_mapping(scope.carrier)
            req, ms = _decode(data, self.max_body_bytes)
            scope.decoded(ms)
            gen = scope.start(params_from_proto(req))
            index = 0
            handoffs: list[tuple[float, float]] = []  # each chunk's yield: (sent, resumed)
            async for ev in gen:
                t0 = now_ms()
                chunk = llm_pb2.GenerateChunk(
                    text=ev.text,
                    token_ids=ev.token_ids,
                    request_id=req.request_id,
                    index=index,
                    emit_ms=round(t0 - scope.t0, 3),
                )
                if ev.finish_reason:
                    chunk.finish_reason = ev.finish_reason
                    chunk.usage.prompt_tokens = gen.prompt_tokens
                    chunk.usage.completion_tokens = gen.completion_tokens
                    chunk.usage.cached_tokens = gen.timing.cached_tokens
                out = chunk.SerializeToString()
                scope.encoded_chunk(t0, now_ms())
                index += len(ev.token_ids)
                t_send = now_ms()
                yield out
                handoffs.append((t_send, now_ms()))
            scope.sent(handoffs)
        except PathprobeError as exc:
            await self._abort(scope, context, exc)
            return
        except asyncio.CancelledError:
            scope.finish("CANCELLED")
            raise
        finally:
            if gen is not None and gen.finish_reason is None:
                gen.close()  # client went away mid-stream: free the engine slot
        entries = scope.finish("OK")
        context.set_trailing_metadata(timing.metadata(entries))

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                # streaming requests on our side only (a call carries one message either way): the
                # handler starts at the call's headers (see _received)
                "Generate": grpc.stream_unary_rpc_method_handler(self.generate),
                "GenerateStream": grpc.stream_stream_rpc_method_handler(self.generate_stream),
            },
        )


async def start_grpc(
    state: ServerState, host: str, port: int, tls: TlsFiles | None = None, max_body_bytes: int | None = None
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """The gRPC server; ``max_body_bytes``: the largest request message (None: gRPC's default of 4 MiB)."""
    options: list[tuple[str, int]] = [("grpc.so_reuseport", 0)]
    if max_body_bytes is not None:
        options.append(("grpc.max_receive_message_length", grpc_receive_cap(max_body_bytes)))
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((LLMService(state, max_body_bytes).handler(),))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    try:
        bound = add_port(server, f"{host}:{port}", tls)
    except RuntimeError:  # newer grpcio raises where older ones returned 0
        bound = 0
    if bound == 0:
        from pathprobe.errors import ConfigError

        raise ConfigError(f"--grpc-port: cannot bind {host}:{port} (in use?)")
    await server.start()
    for name in ("", SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound, health_servicer
