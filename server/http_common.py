"""The HTTP routes' contract with a web framework, and helpers shared by the routes.

Routes (``http_native``, ``openai_api``) never see a framework: they take an
:class:`HttpRequest` and return a :class:`Reply` (one body) or a :class:`StreamReply`
(Server-Sent Events). ``http_app`` (aiohttp) and ``fastapi_app`` (FastAPI) adapt them,
so both front ends answer with the same bodies, errors and timing entries.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from pathprobe import jsoncodec, loopwait, timing
from pathprobe.deadline import RETRY_AFTER, TIMEOUT_HEADER, retry_after_header
from pathprobe.errors import PathprobeError
from pathprobe.jsontypes import JsonObject
from pathprobe.server.core import RequestScope, ServerState
from pathprobe.timing import now_ms

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}
SSE_DONE = b"data: [DONE]\n\n"
JSON = "application/json"


@dataclass(slots=True)
class HttpRequest:
    """What a route needs of an HTTP request, whatever framework received it.

    ``read`` returns the whole body and raises :class:`~pathprobe.errors.PayloadTooLarge`
    past the server's limit.
    """

    state: ServerState
    method: str
    path: str
    headers: Mapping[str, str]
    port: int
    read: Callable[[], Awaitable[bytes]]
    #: when the request's bytes can first have been readable to the loop (``srv.wait``; None: not measured)
    floor_ms: float | None = None


@dataclass(slots=True)
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = JSON


@dataclass(slots=True)
class StreamReply:
    """An SSE stream. The adapter writes each event; when the client goes away it closes
    ``events`` (the route then books the request as 499 and frees the engine)."""

    events: AsyncGenerator[bytes, None]


Handler = Callable[[HttpRequest], Awaitable["Reply | StreamReply"]]


def error_body(exc: PathprobeError) -> JsonObject:
    return exc.to_json()


def timing_headers(entries: Mapping[str, float] | None) -> dict[str, str]:
    if not entries:
        return {}
    return {timing.HTTP_HEADER: timing.format_entries(entries), **dict(timing.count_items(entries))}


def error_reply(exc: PathprobeError, entries: Mapping[str, float] | None = None) -> Reply:
    """The JSON error answer; an overload refusal carries its retry hint (``Retry-After``)."""
    headers = timing_headers(entries)
    retry = getattr(exc, "retry_after_ms", None)
    if retry is not None:
        headers[RETRY_AFTER] = retry_after_header(retry)
    return Reply(exc.http_status, jsoncodec.dumps(error_body(exc)), headers)


def json_reply(body: bytes, entries: Mapping[str, float]) -> Reply:
    return Reply(200, body, timing_headers(entries))


def scope_for(request: HttpRequest, route: str) -> RequestScope:
    return RequestScope(
        request.state,
        route,
        dict(request.headers),
        f"{request.method} {request.path}",
        {
            "http.request.method": request.method,
            "url.path": request.path,
            "network.protocol.name": "http",
            "server.port": request.port,
        },
        timeout_header=request.headers.get(TIMEOUT_HEADER),
        floor_ms=request.floor_ms,
    )


async def read_json(request: HttpRequest, scope: RequestScope) -> JsonObject:
    """Read and parse the body as a JSON object; the parse time is srv.decode. Where the loop slept
    during the read, the handler was waiting for the body's bytes: that read is ``srv.body`` (the
    links' time, :data:`pathprobe.timing.BODY_PART`); otherwise ``srv.body`` is 0 and the read stays the
    server's own."""
    t_read = now_ms()
    body = await request.read()
    t0 = now_ms()
    waited = loopwait.body_wait_ms(t_read, t0)
    if waited is not None:  # every request of a watched loop reports it (0: the body was in)
        scope.body_ms = waited
    obj = jsoncodec.loads_object(body)
    scope.decoded(now_ms() - t0)
    return obj


def encode_json(scope: RequestScope, obj: object) -> bytes:
    t0 = now_ms()
    out = jsoncodec.dumps(obj)
    scope.encoded(now_ms() - t0)
    return out


def sse_event(scope: RequestScope, obj: object) -> bytes:
    """One SSE event of a stream; its encode counts in ``srv.encode`` only where it held the stream's
    end back (after the engine's last token: :meth:`RequestScope.encoded_chunk`)."""
    t0 = now_ms()
    out = b"data: " + jsoncodec.dumps(obj) + b"\n\n"
    scope.encoded_chunk(t0, now_ms())
    return out
