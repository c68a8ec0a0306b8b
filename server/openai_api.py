"""OpenAI-compatible routes: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

Request bodies are validated with pydantic; a wrong field gets HTTP 400 with the
field's name in ``error.param`` and the message. Streams end with a chunk that carries
``usage`` (when asked for with ``stream_options.include_usage``) and ``server_timing``.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any, Literal, TypeVar

from pathprobe import jsoncodec, timing
from pathprobe.errors import InvalidArgument, PathprobeError
from pathprobe.jsontypes import JsonObject
from pathprobe.server.core import RequestScope
from pathprobe.server.engine.base import Generation, GenParams
from pathprobe.server.http_common import (
    SSE_DONE,
    HttpRequest,
    Reply,
    StreamReply,
    encode_json,
    error_body,
    error_reply,
    json_reply,
    read_json,
    scope_for,
    sse_event,
)
from pathprobe.timing import now_ms
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

Number = StrictInt | StrictFloat


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: StrictBool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: Number = 1.0
    top_p: Number = 1.0
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = 1
    ignore_eos: StrictBool = False  # vLLM's extension, handy for fixed-length load
    user: StrictStr | None = None


class CompletionRequest(_Common):
    prompt: StrictStr | list[StrictStr] | list[StrictInt]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: StrictStr | list[dict[str, Any]]


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None


_Body = TypeVar("_Body", bound=BaseModel)


def _validate(model: type[_Body], obj: JsonObject) -> _Body:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "body"
        raise InvalidArgument(field, err["msg"]) from None


def _params(body: _Common, max_tokens: int | None, prompt: str | None, ids: list[int] | None) -> GenParams:
    if body.n != 1:
        raise InvalidArgument("n", "only n=1 is supported")
    for key in ("temperature", "top_p"):
        v = float(getattr(body, key))
        if math.isnan(v):
            raise InvalidArgument(key, "must not be NaN")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return GenParams(
        prompt=prompt,
        prompt_token_ids=ids,
        max_tokens=16 if max_tokens is None else max_tokens,
        temperature=float(body.temperature),
        top_p=float(body.top_p),
        seed=body.seed or 0,
        ignore_eos=body.ignore_eos,
        stop=stop,
        request_id=body.user or "",
        model=body.model or "",
    )


def _text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


async def completions(request: HttpRequest) -> Reply | StreamReply:
    scope = scope_for(request, "openai.completions")
    try:
        obj = await read_json(request, scope)
        t0 = now_ms()
        body = _validate(CompletionRequest, obj)
        raw = body.prompt
        prompt: str | None = None
        ids: list[int] | None = None
        if isinstance(raw, str):
            prompt = raw
        elif raw and isinstance(raw[0], int):
            ids = [int(t) for t in raw]  # token ids (validated: all ints)
        elif len(raw) == 1 and isinstance(raw[0], str):
            prompt = raw[0]
        else:
            raise InvalidArgument("prompt", "a batch of prompts is not supported; send one prompt per request")
        params = _params(body, body.max_tokens, prompt, ids)
        scope.decoded(now_ms() - t0)
        return await _respond(request, scope, params, body, chat=False)
    except PathprobeError as exc:
        return error_reply(exc, scope.finish(str(exc.http_status), error=exc))


async def chat_completions(request: HttpRequest) -> Reply | StreamReply:
    scope = scope_for(request, "openai.chat")
    try:
        obj = await read_json(request, scope)
        t0 = now_ms()
        body = _validate(ChatRequest, obj)
        messages = [{"role": m.role, "content": _text_of(m.content)} for m in body.messages]
        tokenizer = request.state.engine.tokenizer
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        params = _params(body, body.max_completion_tokens or body.max_tokens, prompt, None)
        scope.decoded(now_ms() - t0)
        return await _respond(request, scope, params, body, chat=True)
    except PathprobeError as exc:
        return error_reply(exc, scope.finish(str(exc.http_status), error=exc))


async def _respond(
    request: HttpRequest, scope: RequestScope, params: GenParams, body: _Common, chat: bool
) -> Reply | StreamReply:
    model = request.state.engine.model_name
    if body.stream:
        scope.route += ".stream"
    gen = scope.start(params)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    if body.stream:
        return StreamReply(_events(scope, gen, body, rid, created, model, chat))
    text, _ = await gen.collect()
    usage = _usage(gen)
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": gen.finish_reason,
        }
        obj = {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": gen.finish_reason}
        obj = {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
    out = encode_json(scope, obj)
    return json_reply(out, scope.finish("200"))


def _usage(gen: Generation) -> JsonObject:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens``: prompt tokens whose KV came
    from the engine's prefix cache (0 where the engine has none)."""
    return {
        "prompt_tokens": gen.prompt_tokens,
        "completion_tokens": gen.completion_tokens,
        "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": gen.timing.cached_tokens},
    }


def _usage_event(scope: RequestScope, gen: Generation, head: JsonObject) -> tuple[bytes, dict[str, float]]:
    """The usage chunk (no choices) with the server's timing, and those entries."""
    entries = scope.entries()
    usage = {**head, "choices": [], "usage": _usage(gen), "server_timing": timing.format_entries(entries)}
    return sse_event(scope, usage), entries


async def _events(
    scope: RequestScope, gen: Generation, body: _Common, rid: str, created: int, model: str, chat: bool
) -> AsyncGenerator[bytes, None]:
    """The stream's events. Its last ones (the finish chunk, the usage chunk where asked for) and the
    ``[DONE]`` go out in one write: written apart, the server's loop could take a turn between them
    (at c=32, its other requests' work), the stream's bytes would end after the server's last
    timestamp, and the consumer could not tell that lateness (the server's) from its own."""
    head: JsonObject = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion"}
    head |= {"created": created, "model": model}
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    first = True
    try:
        async for ev in gen:
            if chat:
                delta: JsonObject = {"content": ev.text}
                if first:
                    delta["role"] = "assistant"
                choice: JsonObject = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": ev.finish_reason}
            else:
                choice = {"index": 0, "text": ev.text, "logprobs": None, "finish_reason": ev.finish_reason}
            first = False
            # emit_ms: an extension field (clients ignore unknown keys): ms since the request arrived
            chunk: JsonObject = {**head, "choices": [choice], "emit_ms": round(now_ms() - scope.t0, 3)}
            if not ev.finish_reason:
                yield sse_event(scope, chunk)
                continue
            if include_usage:
                last = sse_event(scope, chunk)
                usage, entries = _usage_event(scope, gen, head)
                yield last + usage + SSE_DONE
            else:
                entries = scope.entries()
                chunk["server_timing"] = timing.format_entries(entries)
                yield sse_event(scope, chunk) + SSE_DONE
            scope.finish("200", entries)
            return
        if include_usage:  # the engine ended without a finish reason
            usage, entries = _usage_event(scope, gen, head)
            yield usage
            scope.finish("200", entries)
        yield SSE_DONE
    except PathprobeError as exc:
        entries = scope.finish(str(exc.http_status), error=exc)
        yield sse_event(scope, {**error_body(exc), "server_timing": timing.format_entries(entries)})
    except GeneratorExit:
        scope.finish("499")  # the client went away
        raise
    finally:
        gen.close()


async def models(request: HttpRequest) -> Reply:
    name = request.state.engine.model_name
    return Reply(
        200,
        jsoncodec.dumps(
            {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "pathprobe"}]}
        ),
    )
