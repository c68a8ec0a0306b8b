"""One request's life on the server, shared by the gRPC and HTTP front ends.

:class:`RequestScope` owns the server span, the stopwatch and the engine's
:class:`Generation`; a front end calls ``decoded()``, ``start()``, ``encoded()`` and
``finish()`` and gets the ``srv.*`` entries back, identical for every front end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from pathprobe import loopwait, telemetry, timing
from pathprobe.auth import ApiKeys
from pathprobe.deadline import parse_timeout
from pathprobe.errors import PathprobeError
from pathprobe.server.engine.base import Engine, Generation, GenParams
from pathprobe.server.metrics import ServerMetrics
from pathprobe.timing import Interval, handoff_split, held_back, now_ms
from pathprobe.v1 import llm_pb2

_tracer = telemetry.get_tracer("pathprobe.server")

# engine timing field -> (span name, Server-Timing entry)
_ENGINE_SPANS = (
    ("tokenize", "engine.tokenize"),
    ("queue", "engine.queue"),
    ("prefill", "engine.prefill"),
    ("decode_steps", "engine.decode_steps"),
)


@dataclass(slots=True)
class ServerState:
    engine: Engine
    metrics: ServerMetrics
    auth: ApiKeys = field(default_factory=ApiKeys)  # empty: no authentication
    draining: bool = False  # SIGTERM seen: health says NOT_SERVING, in-flight requests finish
    #: called once with the first request's srv.total (startup attribution)
    on_first_request: Callable[[float, float], None] | None = None

    def first_request_done(self, start: float, total_ms: float) -> None:
        hook, self.on_first_request = self.on_first_request, None
        if hook is not None:
            hook(start, total_ms)


def params_from_proto(req: llm_pb2.GenerateRequest) -> GenParams:
    return GenParams(
        prompt=req.prompt or None,
        prompt_token_ids=list(req.prompt_token_ids) or None,
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p or 1.0,
        seed=req.seed,
        ignore_eos=req.ignore_eos,
        stop=list(req.stop),
        request_id=req.request_id,
        model=req.model,
    )


@dataclass(slots=True)
class RequestScope:
    state: ServerState
    route: str
    carrier: Mapping[str, str]
    span_name: str
    attributes: dict[str, Any] = field(default_factory=dict)
    t0: float = field(default_factory=now_ms)
    decode_ms: float = 0.0
    encode_ms: float = 0.0
    #: a stream's hand-off time that held its end back (``srv.send``; the front end measures it,
    #: e.g. :func:`pathprobe.timing.held_back`); None: not reported
    send_ms: float | None = None
    #: a stream's hand-offs after the engine's last token, before the last one: the server was behind
    #: its engine (``srv.backlog``, its own time: :func:`pathprobe.timing.handoff_split`)
    backlog_ms: float | None = None
    #: the handler's wait for the request body's bytes after its headers, at the start of ``srv.total``
    #: (``srv.body``: the links' time, :data:`pathprobe.timing.BODY_PART`); None: not measured
    body_ms: float | None = None
    #: a stream's chunk encodes as ``now_ms()`` intervals: only what lies after the engine's last
    #: token counts in ``srv.encode`` (:func:`pathprobe.timing.held_back`; the rest overlapped it)
    chunk_encodes: list[Interval] = field(default_factory=list)
    gen: Generation | None = None
    #: the earliest instant the request's bytes can have been readable to the front end's loop
    #: (:func:`pathprobe.loopwait.floor_of`): ``srv.wait`` is ``t0`` less it; None: not measured
    floor_ms: float | None = None
    #: the caller's deadline: an absolute now_ms() instant (gRPC), or the HTTP ``grpc-timeout`` header
    deadline_ms: float = 0.0
    timeout_header: str | None = None
    span: trace.Span = field(init=False)
    _decode_start: float = 0.0

    def __post_init__(self) -> None:
        ctx = telemetry.extract(self.carrier)
        self.span = _tracer.start_span(
            self.span_name,
            context=ctx,
            kind=SpanKind.SERVER,
            attributes=self.attributes,
            start_time=telemetry.mono_ms_to_wall_ns(self.t0),
        )

    def decoded(self, ms: float) -> None:
        self._decode_start = now_ms() - ms
        self.decode_ms += ms

    def start(self, params: GenParams) -> Generation:
        if self.timeout_header is not None:  # measured from arrival (t0); a bad value is InvalidArgument
            self.deadline_ms = self.t0 + (parse_timeout(self.timeout_header) or 0.0) * 1000.0
        if self.deadline_ms and not params.deadline_ms:
            params.deadline_ms = self.deadline_ms
        self.gen = self.state.engine.generate(params)
        if self.span.is_recording():
            self.span.set_attribute("gen_ai.request.max_tokens", params.max_tokens)
            self.span.set_attribute("gen_ai.request.temperature", params.temperature)
            self.span.set_attribute("gen_ai.request.model", self.state.engine.model_name)
            if params.request_id:
                self.span.set_attribute("gen_ai.request.id", params.request_id)
        return self.gen

    def encoded(self, ms: float) -> None:
        self.encode_ms += ms

    def encoded_chunk(self, start: float, end: float) -> None:
        """A stream's chunk encoded from ``start`` to ``end`` (``now_ms()``)."""
        self.chunk_encodes.append((start, end))

    def sent(self, handoffs: Sequence[Interval]) -> None:
        """A stream's hand-offs to the transport, each chunk's (sent, resumed): the last one's part after
        the engine's last token is ``srv.send`` (the link's), the earlier ones' ``srv.backlog``."""
        send, backlog = handoff_split(handoffs, self.last_ready())
        self.send_ms = (self.send_ms or 0.0) + send
        self.backlog_ms = (self.backlog_ms or 0.0) + backlog

    def last_ready(self) -> float:
        """When the engine's latest token was ready (0: none yet)."""
        return self.gen.last_ready_ms if self.gen is not None else 0.0

    def encode_total(self) -> float:
        """``srv.encode``: the unary encode, and the chunk encodes that held the stream's end back."""
        return self.encode_ms + held_back(self.chunk_encodes, self.last_ready())

    def entries(self) -> dict[str, float]:
        """The srv.* entries now; ``srv.total`` is measured at this call (with the prompt tokens
        the engine's prefix cache served beside them: :class:`pathprobe.timing.Entries`)."""
        out = timing.Entries({"srv.decode": self.decode_ms})
        wait = loopwait.wait_ms(self.floor_ms, self.t0)
        if wait is not None:
            out["srv.wait"] = wait
        if self.body_ms is not None:
            out["srv.body"] = self.body_ms
        if self.gen is not None:
            out.update(self.gen.timing.entries())
            out.cached_tokens = self.gen.timing.cached_tokens
        out["srv.encode"] = self.encode_total()
        if self.send_ms is not None:
            out["srv.send"] = self.send_ms
        if self.backlog_ms is not None:
            out["srv.backlog"] = self.backlog_ms
        out["srv.total"] = now_ms() - self.t0
        return out

    def finish(
        self, code: str, entries: dict[str, float] | None = None, error: PathprobeError | None = None
    ) -> dict[str, float]:
        entries = entries or self.entries()
        self.state.metrics.observe(self.route, code, entries)
        self.state.first_request_done(self.t0, entries["srv.total"])
        gen = self.gen
        first = gen.timing.first_token_at - self.t0 if gen is not None and gen.timing.first_token_at else None
        tokens = gen.completion_tokens if gen is not None else 0
        self.state.metrics.observe_genai(self.route, code, entries["srv.total"], first, tokens)
        if gen is not None:
            self.state.metrics.observe_generation(gen.prompt_tokens, gen.completion_tokens, gen.timing.batch_size)
        self._end_span(entries, code, error, gen)
        return entries

    def _end_span(
        self, entries: dict[str, float], code: str, error: PathprobeError | None, gen: Generation | None
    ) -> None:
        span = self.span
        if not span.is_recording():
            span.end()
            return
        span.set_attribute("server_timing", ", ".join(f"{k};dur={v:.3f}" for k, v in entries.items()))
        span.set_attribute("pathprobe.status", code)
        wait = entries.get("srv.wait", 0.0)
        if wait:  # before the handler's entry (t0): the request waited for the loop
            telemetry.child_span(_tracer, "server.wait", span, self.t0 - wait, wait, {"pathprobe.entry": "srv.wait"})
        if self.body_ms:  # the request's start: its body's bytes still coming in
            telemetry.child_span(_tracer, "server.body", span, self.t0, self.body_ms, {"pathprobe.entry": "srv.body"})
        if self._decode_start:
            telemetry.child_span(
                _tracer, "server.decode", span, self._decode_start, self.decode_ms, {"pathprobe.entry": "srv.decode"}
            )
        if gen is not None:
            t = gen.timing
            span.set_attribute("gen_ai.usage.input_tokens", gen.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", gen.completion_tokens)
            if gen.finish_reason:
                span.set_attribute("gen_ai.response.finish_reasons", [gen.finish_reason])
            starts = {
                "tokenize": t.tokenize_start,
                "queue": t.queue_start,
                "prefill": t.prefill_start,
                "decode_steps": t.decode_start,
            }
            for attr, name in _ENGINE_SPANS:
                if starts[attr]:
                    telemetry.child_span(
                        _tracer, name, span, starts[attr], getattr(t, attr), {"pathprobe.entry": f"srv.{attr}"}
                    )
            if t.decode_start and t.detokenize:
                # detokenize is interleaved with decode steps; placed after them as one interval
                telemetry.child_span(
                    _tracer,
                    "engine.detokenize",
                    span,
                    t.decode_start + t.decode_steps,
                    t.detokenize,
                    {"pathprobe.entry": "srv.detokenize"},
                )
        encode = entries.get("srv.encode", 0.0)
        if encode:
            # (possibly several chunks') encoding shown as one interval ending with the response
            end = self.t0 + entries["srv.total"]
            telemetry.child_span(
                _tracer, "server.encode", span, end - encode, encode, {"pathprobe.entry": "srv.encode"}
            )
        if self.send_ms:
            # a stream's waits for the transport to take each chunk, shown as one interval before that
            end = self.t0 + entries["srv.total"] - encode
            telemetry.child_span(
                _tracer, "server.send", span, end - self.send_ms, self.send_ms, {"pathprobe.entry": "srv.send"}
            )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error.message))
            span.set_attribute("error.type", type(error).__name__)
        span.end(end_time=telemetry.mono_ms_to_wall_ns(self.t0 + entries["srv.total"]))
