"""The server's HTTP application: native + OpenAI routes, /healthz, /metrics."""

from __future__ import annotations

from aiohttp import web

from pathprobe.errors import NotFound, PathprobeError
from pathprobe.server import http_native, openai_api
from pathprobe.server.core import ServerState
from pathprobe.server.http_common import STATE_KEY, error_response
from pathprobe.server.metrics import CONTENT_TYPE

DEFAULT_MAX_BODY = 4 * 1024 * 1024


async def healthz(request: web.Request) -> web.Response:
    """200 while serving; 503 ``draining`` once SIGTERM is seen (balancers take the server out)."""
    state = request.app[STATE_KEY]
    engine = state.engine
    return web.json_response({"status": "draining" if state.draining else "ok", "model": engine.model_name,
                              "queue_depth": engine.queue_depth(), "running": engine.running()},
                             status=503 if state.draining else 200)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[STATE_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


#: paths any caller may read (probes and scrapers carry no key)
OPEN_PATHS = frozenset({"/healthz", "/metrics", "/openapi.json"})


@web.middleware
async def json_errors(request: web.Request, handler):  # noqa: ANN001
    """Unknown paths and wrong methods answer JSON errors like every other failure; with API keys
    set, every other path needs one (401, counted under route ``http.auth``)."""
    state = request.app[STATE_KEY]
    if state.auth and request.path not in OPEN_PATHS:
        try:
            state.auth.check_mapping(request.headers)
        except PathprobeError as exc:
            state.metrics.observe("http.auth", str(exc.http_status), {})
            resp = error_response(exc)
            resp.headers["WWW-Authenticate"] = "Bearer"
            return resp
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return error_response(NotFound(f"path: no route {request.path}"))
    except web.HTTPMethodNotAllowed as exc:
        err = PathprobeError(f"method: {request.method} not allowed on {request.path} (use {', '.join(exc.allowed_methods)})")
        err.http_status = 405
        return error_response(err)


def build_app(state: ServerState, max_body_bytes: int = DEFAULT_MAX_BODY) -> web.Application:  # noqa: D103
    app = web.Application(client_max_size=max_body_bytes, middlewares=[json_errors])
    app[STATE_KEY] = state
    app.add_routes([web.get("/healthz", healthz), web.get("/metrics", metrics)])
    app.add_routes(http_native.routes())
    app.add_routes(openai_api.routes())
    return app
