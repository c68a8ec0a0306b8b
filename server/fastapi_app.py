"""The FastAPI front end (``pathprobe serve --http-server fastapi``): the same route
table, bodies, errors and timing entries as the aiohttp one, served by FastAPI on
uvicorn, so a user sees what the framework costs (``compare`` can put both side by side).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from pathprobe.errors import NotFound, PathprobeError, PayloadTooLarge
from pathprobe.server.core import ServerState
from pathprobe.server.http_common import SSE_DONE, SSE_HEADERS, HttpRequest, Reply, StreamReply, error_reply
from pathprobe.server.openapi import document
from pathprobe.server.routes import ROUTES, Route, call
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response, StreamingResponse
from starlette.types import Send


def _response(reply: Reply) -> Response:
    return Response(reply.body, status_code=reply.status, headers=reply.headers, media_type=reply.content_type)


def _reader(request: Request, max_body_bytes: int) -> Callable[[], Awaitable[bytes]]:
    async def read() -> bytes:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > max_body_bytes:
            raise PayloadTooLarge(
                f"body: {size} bytes exceed the server's limit of {max_body_bytes} bytes (--max-body-bytes)"
            )
        chunks: list[bytes] = []
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > max_body_bytes:
                raise PayloadTooLarge(
                    f"body: more than {max_body_bytes} bytes exceed the server's limit of {max_body_bytes} bytes "
                    "(--max-body-bytes)"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    return read


class _EventStream(StreamingResponse):
    """An SSE stream whose end (the chunked body's terminator) goes out in the same write as its last
    event (``[DONE]``), as the aiohttp front end's does: after that event the route books the request
    (metrics, its span), which a busy machine can stretch to ms, and Starlette's empty closing message
    would leave that much after the server's last timestamp."""

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        more = True
        async for chunk in self.body_iterator:
            body = chunk.encode(self.charset) if isinstance(chunk, str) else bytes(chunk)
            more = not body.endswith(SSE_DONE)
            await send({"type": "http.response.body", "body": body, "more_body": more})
        if more:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _events(reply: StreamReply) -> AsyncIterator[bytes]:
    """Starlette closes this generator when the client goes away; the route's events follow."""
    try:
        async for event in reply.events:
            yield event
    finally:
        await reply.events.aclose()


def _endpoint(route: Route, state: ServerState, max_body_bytes: int) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        req = HttpRequest(
            state,
            request.method,
            request.url.path,
            request.headers,
            request.url.port or 0,
            _reader(request, max_body_bytes),
        )
        try:
            reply = await call(route, req)
        except PayloadTooLarge as exc:  # raised while reading, before the route has a scope
            return _response(error_reply(exc))
        if isinstance(reply, StreamReply):
            return _EventStream(_events(reply), headers=SSE_HEADERS, media_type="text/event-stream")
        return _response(reply)

    return endpoint


async def _http_error(request: Request, exc: Any) -> Response:
    if exc.status_code == 404:
        return _response(error_reply(NotFound(f"path: no route {request.url.path}")))
    err = PathprobeError(
        f"method: {request.method} not allowed on {request.url.path}" if exc.status_code == 405 else str(exc.detail)
    )
    err.http_status = exc.status_code
    return _response(error_reply(err))


def build_app(state: ServerState, max_body_bytes: int) -> FastAPI:
    app = FastAPI(title="pathprobe model server", openapi_url="/openapi.json", docs_url="/docs", redoc_url=None)
    for route in ROUTES:
        app.add_api_route(
            route.path,
            _endpoint(route, state, max_body_bytes),
            methods=[route.method],
            summary=route.summary,
            include_in_schema=False,
        )
    # one document for both front ends, from the route table
    app.openapi = document  # type: ignore[method-assign]
    app.add_exception_handler(StarletteHTTPException, _http_error)
    return app
