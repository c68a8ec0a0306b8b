"""The server's HTTP routes, one table for every front end (aiohttp, FastAPI).

Each :class:`Route` names its handler and the JSON schema of its request body, which is
what the published OpenAPI document shows: the body itself is read and validated by the
handler (so the decode time is ``srv.decode`` and a wrong field gets our 400, not a
framework's 422).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from pathprobe import jsoncodec
from pathprobe.errors import PathprobeError
from pathprobe.jsontypes import JsonObject
from pathprobe.server import http_native, openai_api
from pathprobe.server.http_common import Handler, HttpRequest, Reply, StreamReply, error_reply
from pathprobe.server.metrics import CONTENT_TYPE
from pathprobe.v1 import llm_pb2


async def healthz(request: HttpRequest) -> Reply:
    """200 while serving; 503 ``draining`` once SIGTERM is seen (balancers take the server out),
    503 ``engine down`` once the engine can serve nothing (its process died)."""
    state = request.state
    engine = state.engine
    down = engine.down()
    body: JsonObject = {
        "status": "engine down" if down else "draining" if state.draining else "ok",
        "model": engine.model_name,
        "queue_depth": engine.queue_depth(),
        "running": engine.running(),
    }
    if down:
        body["reason"] = down
    return Reply(503 if down or state.draining else 200, jsoncodec.dumps(body))


async def metrics(request: HttpRequest) -> Reply:
    return Reply(200, request.state.metrics.render(), content_type=CONTENT_TYPE)


_JSON_TYPES = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "boolean",
    FieldDescriptor.TYPE_FLOAT: "number",
    FieldDescriptor.TYPE_DOUBLE: "number",
}


def _properties(desc: Descriptor) -> dict[str, JsonObject]:
    props: dict[str, JsonObject] = {}
    for fd in desc.fields:
        item: JsonObject = {"type": _JSON_TYPES.get(fd.type, "integer")}
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        props[fd.name] = {"type": "array", "items": item} if repeated else item
    return props


def _object_schema(desc: Descriptor, props: dict[str, JsonObject]) -> JsonObject:
    properties: JsonObject = dict(props)
    return {"type": "object", "properties": properties, "additionalProperties": False, "title": desc.name}


def proto_schema(desc: Descriptor) -> JsonObject:
    """JSON schema of a flat protobuf message as the native routes read it (proto field names)."""
    return _object_schema(desc, _properties(desc))


#: the limits the engine checks, in the document too (a schema-driven client then sends
#: requests the server can accept, and one that breaks them is answered 400)
_NATIVE_LIMITS: dict[str, JsonObject] = {
    "prompt": {"minLength": 1},
    "max_tokens": {"minimum": 1, "maximum": 8192},
    "temperature": {"minimum": 0, "maximum": 2},
    "top_p": {"exclusiveMinimum": 0, "maximum": 1},
}


def _native_schema() -> JsonObject:
    desc = llm_pb2.GenerateRequest.DESCRIPTOR
    props = _properties(desc)
    for name, limits in _NATIVE_LIMITS.items():
        props[name].update(limits)
    props["stream"] = {"type": "boolean", "description": "answer as Server-Sent Events"}
    return _object_schema(desc, props)


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    request_schema: Callable[[], Mapping[str, object]] | None = None  # () -> JSON schema of the body


ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", healthz, "Health: engine, queue depth, running requests"),
    Route("GET", "/metrics", metrics, "Prometheus metrics"),
    Route("POST", "/v1/generate", http_native.generate, "Generate (native JSON; SSE with stream=true)", _native_schema),
    Route(
        "POST",
        "/v1/completions",
        openai_api.completions,
        "OpenAI-compatible completions",
        openai_api.CompletionRequest.model_json_schema,
    ),
    Route(
        "POST",
        "/v1/chat/completions",
        openai_api.chat_completions,
        "OpenAI-compatible chat completions",
        openai_api.ChatRequest.model_json_schema,
    ),
    Route("GET", "/v1/models", openai_api.models, "Models served"),
)


#: paths any caller may read without a key (probes, scrapers, the API's description)
OPEN_PATHS = frozenset({"/healthz", "/metrics", "/openapi.json", "/docs"})


async def call(route: Route, request: HttpRequest) -> Reply | StreamReply:
    """Run ``route`` for ``request`` (every front end calls routes through this): with API keys
    set, every path but :data:`OPEN_PATHS` needs one (401, counted under route ``http.auth``)."""
    state = request.state
    if state.auth and route.path not in OPEN_PATHS:
        try:
            state.auth.check_mapping(request.headers)
        except PathprobeError as exc:
            state.metrics.observe("http.auth", str(exc.http_status), {})
            refused = error_reply(exc)
            refused.headers["WWW-Authenticate"] = "Bearer"
            return refused
    reply: Reply | StreamReply = await route.handler(request)
    return reply
