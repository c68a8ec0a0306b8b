"""Native HTTP/JSON route: ``POST /v1/generate`` (SSE with ``stream: true``)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from pathprobe import jsoncodec, timing
from pathprobe.errors import PathprobeError
from pathprobe.server.core import RequestScope, params_from_proto
from pathprobe.server.engine.base import Generation
from pathprobe.server.http_common import (
    SSE_DONE,
    HttpRequest,
    Reply,
    StreamReply,
    error_body,
    error_reply,
    json_reply,
    read_json,
    scope_for,
    sse_event,
)
from pathprobe.timing import now_ms
from pathprobe.v1 import llm_pb2


async def generate(request: HttpRequest) -> Reply | StreamReply:
    scope = scope_for(request, "http.generate")
    try:
        obj = await read_json(request, scope)
        t0 = now_ms()
        req = jsoncodec.request_from_dict(obj)
        stream = jsoncodec.stream_flag(obj)
        scope.decoded(now_ms() - t0)
        if stream:
            scope.route = "http.generate.stream"
        gen = scope.start(params_from_proto(req))
        if stream:
            return StreamReply(_events(scope, gen, req))
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
            model=request.state.engine.model_name,
        )
        body = jsoncodec.dumps(jsoncodec.to_dict(resp))
        scope.encoded(now_ms() - t0)
    except PathprobeError as exc:
        return error_reply(exc, scope.finish(str(exc.http_status), error=exc))
    return json_reply(body, scope.finish("200"))


async def _events(scope: RequestScope, gen: Generation, req: llm_pb2.GenerateRequest) -> AsyncGenerator[bytes, None]:
    index = 0
    try:
        async for ev in gen:
            chunk = {
                "text": ev.text,
                "token_ids": ev.token_ids,
                "finish_reason": ev.finish_reason or "",
                "request_id": req.request_id,
                "index": index,
                "emit_ms": round(now_ms() - scope.t0, 3),
            }
            index += len(ev.token_ids)
            if ev.finish_reason:
                chunk["usage"] = {
                    "prompt_tokens": gen.prompt_tokens,
                    "completion_tokens": gen.completion_tokens,
                    "cached_tokens": gen.timing.cached_tokens,
                }
                entries = scope.entries()
                chunk["server_timing"] = timing.format_entries(entries)
                # the last event and the [DONE] in one write (see openai_api._events)
                yield sse_event(scope, chunk) + SSE_DONE
                scope.finish("200", entries)
                return
            yield sse_event(scope, chunk)
        yield SSE_DONE
    except PathprobeError as exc:
        entries = scope.finish(str(exc.http_status), error=exc)
        err = {**error_body(exc), "server_timing": timing.format_entries(entries)}
        yield b"data: " + jsoncodec.dumps(err) + b"\n\n"
    except GeneratorExit:
        scope.finish("499")  # the client went away
        raise
    finally:
        gen.close()
