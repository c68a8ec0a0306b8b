"""The aiohttp front end (the default): the route table served by aiohttp."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from pathprobe import loopwait
from pathprobe.errors import NotFound, PathprobeError, PayloadTooLarge
from pathprobe.serveconfig import DEFAULT_MAX_BODY
from pathprobe.server.core import ServerState
from pathprobe.server.http_common import SSE_DONE, SSE_HEADERS, HttpRequest, Reply, StreamReply, error_reply
from pathprobe.server.routes import ROUTES, Route, call

STATE_KEY: web.AppKey[ServerState] = web.AppKey("state", ServerState)


def _response(reply: Reply) -> web.Response:
    return web.Response(
        status=reply.status,
        body=reply.body,
        headers=reply.headers,
        content_type=reply.content_type.split(";")[0],
        charset=None,
    )


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        size = request.content_length
        what = f"{size} bytes exceed" if size else "the body exceeds"
        raise PayloadTooLarge(
            f"body: {what} the server's limit of {request.client_max_size} bytes (--max-body-bytes)"
        ) from None


async def _stream(request: web.Request, reply: StreamReply) -> web.StreamResponse:
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    try:
        async for event in reply.events:
            if event.endswith(SSE_DONE):
                # the stream's end (the chunked body's terminator) in the same write as its last event:
                # after it, the route books the request (metrics, its span), which can take ms on a busy
                # machine; an end written apart would leave that much after the server's last timestamp
                await resp.write_eof(event)
            else:
                await resp.write(event)
    except (ConnectionResetError, OSError):
        await reply.events.aclose()
    return resp


def _view(route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def view(request: web.Request) -> web.StreamResponse:
        req = HttpRequest(
            request.app[STATE_KEY],
            request.method,
            request.path,
            request.headers,
            request.url.port or 0,
            lambda: _read(request),
            loopwait.floor_of(request.transport),
        )
        reply = await call(route, req)
        return await _stream(request, reply) if isinstance(reply, StreamReply) else _response(reply)

    return view


async def openapi(request: web.Request) -> web.Response:
    from pathprobe.server.openapi import document

    return web.json_response(document())


@web.middleware
async def json_errors(request: web.Request, handler):
    """Unknown paths and wrong methods answer JSON errors like every other failure."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _response(error_reply(NotFound(f"path: no route {request.path}")))
    except web.HTTPMethodNotAllowed as exc:
        err = PathprobeError(
            f"method: {request.method} not allowed on {request.path} (use {', '.join(exc.allowed_methods)})"
        )
        err.http_status = 405
        return _response(error_reply(err))


def build_app(state: ServerState, max_body_bytes: int = DEFAULT_MAX_BODY) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes, middlewares=[json_errors])
    app[STATE_KEY] = state
    app.add_routes(
        [web.get(r.path, _view(r)) if r.method == "GET" else web.route(r.method, r.path, _view(r)) for r in ROUTES]
    )
    app.add_routes([web.get("/openapi.json", openapi)])
    return app
