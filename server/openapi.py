"""The HTTP API's OpenAPI 3.1 document, built from the route table (served at
``/openapi.json`` by every front end)."""

from __future__ import annotations

import functools

from pathprobe import __version__
from pathprobe.server.routes import ROUTES, Route

_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "code": {"type": "integer"},
                "status": {"type": "string", "description": "the gRPC status code's name"},
                "param": {"type": ["string", "null"], "description": "the field at fault"},
            },
        }
    },
}
_ERRORS = {
    "400": "invalid request (error.param names the field)",
    "401": "missing or wrong API key (when the server has one); WWW-Authenticate: Bearer",
    "404": "unknown path or model",
    "405": "method not allowed",
    "413": "body larger than the server's limit",
    "429": "queue full (Retry-After says when to try again)",
    "503": "unavailable (draining, or no engine)",
    "504": "the caller's deadline (grpc-timeout header) passed",
}
_TIMING = {
    "Server-Timing": {
        "description": "the server's split: srv.decode, srv.queue, srv.tokenize, srv.prefill, "
        "srv.decode_steps, srv.detokenize, srv.encode, srv.total (ms)",
        "schema": {"type": "string"},
    }
}


def _operation(route: Route) -> dict[str, object]:
    ok: dict[str, object] = {"description": "OK", "headers": _TIMING}
    responses: dict[str, object] = {"200": ok}
    op: dict[str, object] = {
        "summary": route.summary,
        "operationId": route.path.strip("/").replace("/", "_").replace(".", "_") or "root",
        "responses": responses,
    }
    if route.request_schema is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": route.request_schema()}}}
        ok["content"] = {"application/json": {}, "text/event-stream": {}}
        for code, text in _ERRORS.items():
            responses[code] = {"description": text, "content": {"application/json": {"schema": _ERROR}}}
    return op


@functools.cache
def document() -> dict[str, object]:
    paths: dict[str, dict[str, object]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {"openapi": "3.1.0", "info": {"title": "pathprobe model server", "version": __version__}, "paths": paths}
