"""Helpers shared by the native and OpenAI-compatible HTTP routes."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from pathprobe import jsoncodec, timing
from pathprobe.deadline import RETRY_AFTER, TIMEOUT_HEADER, retry_after_header
from pathprobe.errors import InvalidArgument, PathprobeError, PayloadTooLarge
from pathprobe.server.core import RequestScope, ServerState
from pathprobe.timing import now_ms

STATE_KEY: web.AppKey[ServerState] = web.AppKey("state", ServerState)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}


def error_body(exc: PathprobeError) -> dict[str, Any]:
    return exc.to_json()


def error_response(exc: PathprobeError, entries: dict[str, float] | None = None) -> web.Response:
    headers = {timing.HTTP_HEADER: timing.format_entries(entries)} if entries else {}
    retry = getattr(exc, "retry_after_ms", None)
    if retry is not None:
        headers[RETRY_AFTER] = retry_after_header(retry)
    return web.Response(status=exc.http_status, body=jsoncodec.dumps(error_body(exc)),
                        content_type="application/json", headers=headers)


def scope_for(request: web.Request, route: str) -> RequestScope:
    return RequestScope(
        request.app[STATE_KEY], route, dict(request.headers), f"{request.method} {request.path}",
        {"http.request.method": request.method, "url.path": request.path, "network.protocol.name": "http",
         "server.port": request.url.port or 0},
        timeout_header=request.headers.get(TIMEOUT_HEADER),
    )


async def read_json(request: web.Request, scope: RequestScope) -> dict[str, Any]:
    """Read and parse the body as a JSON object; the parse time is srv.decode."""
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        size = request.content_length
        raise PayloadTooLarge(f"body: {size or 'the'} bytes exceed the server's limit (--max-body-bytes)") from None
    t0 = now_ms()
    obj = jsoncodec.loads_object(body)
    scope.decoded(now_ms() - t0)
    return obj


def encode_json(scope: RequestScope, obj: Any) -> bytes:
    t0 = now_ms()
    out = jsoncodec.dumps(obj)
    scope.encoded(now_ms() - t0)
    return out


def sse_event(scope: RequestScope, obj: Any) -> bytes:
    t0 = now_ms()
    out = b"data: " + jsoncodec.dumps(obj) + b"\n\n"
    scope.encoded(now_ms() - t0)
    return out


SSE_DONE = b"data: [DONE]\n\n"


def require_type(obj: dict[str, Any], key: str, types: tuple[type, ...], what: str) -> Any:
    value = obj.get(key)
    if value is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
        raise InvalidArgument(key, f"must be {what}, got {type(value).__name__}")
    return value
