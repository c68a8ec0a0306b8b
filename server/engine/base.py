"""The engine interface every front end talks to.

An engine takes a validated :class:`GenParams`, and :meth:`Engine.generate` returns a
:class:`Generation`: an async iterator of :class:`TokenEvent` plus the request's
:class:`EngineTiming` (queue, tokenize, prefill, decode steps, detokenize), filled in
as the request runs. Front ends never touch the model directly.
"""

from __future__ import annotations

import abc
import asyncio
import math
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pathprobe import engineoptions, serveconfig
from pathprobe.engineoptions import EngineOptions, Raw
from pathprobe.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted
from pathprobe.serveconfig import DEFAULTS, ServeConfig
from pathprobe.timing import now_ms

#: Upper bound on max_tokens regardless of the model's context.
MAX_TOKENS_LIMIT = 8192


@dataclass(slots=True)
class EngineConfig:
    """What an engine reads of the server's configuration. Defaults and checks are the serve
    options' own (:mod:`pathprobe.serveconfig`): one default and one check per key."""

    kind: serveconfig.Engine = DEFAULTS.engine
    model: str = DEFAULTS.model  # "tiny" | a local folder | "preset:NAME"
    model_name: str | None = DEFAULTS.model_name  # name served to clients (default: derived from model)
    device: str = DEFAULTS.device  # "cpu" | "cuda" | "auto"
    dtype: str = DEFAULTS.dtype  # "float32" | "bfloat16" | "float16" | "auto"
    max_batch_size: int = DEFAULTS.max_batch_size
    max_wait_ms: float = DEFAULTS.max_wait_ms
    max_queue: int = DEFAULTS.max_queue
    max_context: int | None = DEFAULTS.max_context  # default: the model's max_position_embeddings
    # synthetic engine
    prefill_ms_per_token: float = DEFAULTS.prefill_ms_per_token
    decode_ms_per_token: float = DEFAULTS.decode_ms_per_token
    #: the engine's typed options (:mod:`pathprobe.engineoptions`); a mapping of KEY: VALUE is
    #: parsed (and checked) into them
    options: EngineOptions | Mapping[str, Raw] | None = None
    #: run the engine in a child process (pathprobe.server.engine.process), apart from the front ends
    process: bool = DEFAULTS.engine_process

    def __post_init__(self) -> None:
        for name, value in (
            ("engine", self.kind),
            ("max_batch_size", self.max_batch_size),
            ("max_wait_ms", self.max_wait_ms),
            ("max_queue", self.max_queue),
            ("max_context", self.max_context),
            ("prefill_ms_per_token", self.prefill_ms_per_token),
            ("decode_ms_per_token", self.decode_ms_per_token),
        ):
            serveconfig.check(name, value)
        self.options = engineoptions.parse(self.kind, self.options)

    @property
    def typed_options(self) -> EngineOptions:
        """The options, typed (``__post_init__`` parsed them)."""
        assert not isinstance(self.options, Mapping | type(None))
        return self.options

    @classmethod
    def from_serve(cls, config: ServeConfig) -> EngineConfig:
        return cls(
            kind=config.engine,
            model=config.model,
            model_name=config.model_name,
            device=config.device,
            dtype=config.dtype,
            max_batch_size=config.max_batch_size,
            max_wait_ms=config.max_wait_ms,
            max_queue=config.max_queue,
            max_context=config.max_context,
            prefill_ms_per_token=config.prefill_ms_per_token,
            decode_ms_per_token=config.decode_ms_per_token,
            options=config.options,
            process=config.engine_process,
        )


@dataclass(slots=True)
class GenParams:
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    request_id: str = ""
    model: str = ""
    #: absolute now_ms() instant the caller stops waiting (0.0: none); past it the request
    #: leaves the queue or the batch before its next step
    deadline_ms: float = 0.0


@dataclass(slots=True)
class TokenEvent:
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # set on the last event: "stop" | "length"
    #: now_ms() when the engine handed it to the front end's loop (set by Generation.push)
    ready_ms: float = field(default=0.0, compare=False, repr=False)


@dataclass(slots=True)
class EngineTiming:
    """Durations in ms, filled in by the engine while the request runs.

    ``*_start`` fields are monotonic ms timestamps (see :func:`pathprobe.timing.now_ms`),
    kept in-process only, so spans can be placed; they never cross a process.
    """

    arrival: float = 0.0
    queue: float = 0.0
    tokenize: float = 0.0
    prefill: float = 0.0
    decode_steps: float = 0.0
    detokenize: float = 0.0
    queue_start: float = 0.0
    tokenize_start: float = 0.0
    prefill_start: float = 0.0
    decode_start: float = 0.0
    first_token_at: float = 0.0  # monotonic ms of the first token handed out
    batch_size: int = 0  # the largest batch this request ran in
    #: prompt tokens whose KV came from the engine's prefix cache (not prefilled again); a count
    cached_tokens: int = 0
    #: which prefill ran (in-process only, for diagnosis): ``graph:N`` (a captured static prefill of
    #: bucket N), ``static:N`` (the same, uncaptured), ``eager:BxW`` (a batched dynamic prefill of B
    #: rows, W columns), ``cached:L+S`` (L tokens from the prefix cache, S computed)
    prefill_path: str = ""

    def entries(self) -> dict[str, float]:
        return {
            "srv.queue": self.queue,
            "srv.tokenize": self.tokenize,
            "srv.prefill": self.prefill,
            "srv.decode_steps": self.decode_steps,
            "srv.detokenize": self.detokenize,
        }


class Generation:
    """One running request: iterate it for tokens; ``timing`` and ``usage`` update live.

    Closing it (``await gen.aclose()``, or leaving an ``async for`` early) cancels the
    request inside the engine and frees its slot.
    """

    def __init__(self, params: GenParams) -> None:
        self.params = params
        self.timing = EngineTiming(arrival=now_ms())
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.cancelled = False
        #: now_ms() when the engine handed the latest token event to the front end's loop
        self.last_ready_ms = 0.0
        #: set by the engine: called once when the front end stops listening early
        self.on_close: Callable[[], None] | None = None
        self._queue: asyncio.Queue[TokenEvent | BaseException | None] = asyncio.Queue()

    # --- engine side -------------------------------------------------------
    def push(self, event: TokenEvent) -> None:
        event.ready_ms = self.last_ready_ms = now_ms()
        self.completion_tokens += len(event.token_ids)
        if event.finish_reason:
            self.finish_reason = event.finish_reason
        self._queue.put_nowait(event)

    def finish(self) -> None:
        self._queue.put_nowait(None)

    def fail(self, exc: BaseException) -> None:
        self._queue.put_nowait(exc)

    # --- front-end side ----------------------------------------------------
    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TokenEvent]:
        try:
            while True:
                item = await self._queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                if not self.timing.first_token_at:
                    self.timing.first_token_at = now_ms()
                yield item
        finally:
            if self.finish_reason is None:
                self.close()

    def close(self) -> None:
        """The front end is gone (client disconnected, error): cancel inside the engine."""
        if self.cancelled or self.finish_reason is not None:
            return
        self.cancelled = True
        if self.on_close is not None:
            self.on_close()

    async def collect(self) -> tuple[str, list[int]]:
        text: list[str] = []
        ids: list[int] = []
        async for ev in self:
            text.append(ev.text)
            ids.extend(ev.token_ids)
        return "".join(text), ids


class Engine(abc.ABC):
    """What a front end needs from an engine."""

    config: EngineConfig
    model_name: str
    max_context: int
    tokenizer: Any  # a transformers tokenizer (real tokenization for every engine)

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model and start the scheduler (call inside the serving loop)."""

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @abc.abstractmethod
    def generate(self, params: GenParams) -> Generation:
        """Validate and enqueue; raises InvalidArgument / ResourceExhausted at once."""

    def prepare(self, params: GenParams) -> tuple[Generation, list[int]]:
        """What every engine does first, at once: validate, tokenize (timed as
        ``srv.tokenize``) and check the context length. Raises InvalidArgument."""
        validate(params, model_name=self.model_name)
        gen = Generation(params)
        t = gen.timing
        t.tokenize_start = now_ms()
        if params.prompt_token_ids:
            check_token_ids(params.prompt_token_ids, len(self.tokenizer))
            ids = list(params.prompt_token_ids)
        else:
            ids = self.encode_prompt(params.prompt or "")
        t.tokenize = now_ms() - t.tokenize_start
        check_context(len(ids), params.max_tokens, self.max_context)
        gen.prompt_tokens = len(ids)
        return gen, ids

    def encode_prompt(self, text: str) -> list[int]:
        """Prompt text -> token ids (the fast tokenizer; an engine may swap in a slow one)."""
        return self.tokenizer.encode(text)

    # --- stats for /metrics --------------------------------------------------
    def queue_depth(self) -> int:
        return 0

    def running(self) -> int:
        return 0

    def down(self) -> str | None:
        """Why the engine can serve nothing any more (its process died), else None."""
        return None


def validate(params: GenParams, *, model_name: str) -> None:
    """Checks that need no tokenizer; the context-length check happens at tokenize time."""
    if params.model and params.model != model_name:
        raise InvalidArgument("model", f"unknown model {params.model!r}; this server serves {model_name!r}")
    has_text = bool(params.prompt)
    has_ids = bool(params.prompt_token_ids)
    if has_text and has_ids:
        raise InvalidArgument("prompt", "set either prompt or prompt_token_ids, not both")
    if not has_text and not has_ids:
        raise InvalidArgument("prompt", "must not be empty")
    if not isinstance(params.max_tokens, int) or isinstance(params.max_tokens, bool):
        raise InvalidArgument("max_tokens", "must be an integer")
    if params.max_tokens <= 0:
        raise InvalidArgument("max_tokens", f"must be at least 1, got {params.max_tokens}")
    if params.max_tokens > MAX_TOKENS_LIMIT:
        raise InvalidArgument("max_tokens", f"must be at most {MAX_TOKENS_LIMIT}, got {params.max_tokens}")
    t = params.temperature
    if not isinstance(t, (int, float)) or isinstance(t, bool) or math.isnan(t) or not 0.0 <= t <= 2.0:
        raise InvalidArgument("temperature", f"must be a number in [0, 2], got {t!r}")
    p = params.top_p
    if not isinstance(p, (int, float)) or isinstance(p, bool) or math.isnan(p) or not 0.0 < p <= 1.0:
        raise InvalidArgument("top_p", f"must be a number in (0, 1], got {p!r}")
    for i, s in enumerate(params.stop):
        if not isinstance(s, str) or not s:
            raise InvalidArgument(f"stop[{i}]", "must be a non-empty string")


def check_context(n_prompt: int, max_tokens: int, max_context: int) -> None:
    if n_prompt + max_tokens > max_context:
        raise InvalidArgument(
            "prompt",
            f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) exceeds the context length {max_context}",
        )


def check_token_ids(ids: list[int], vocab_size: int) -> None:
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise InvalidArgument(
                f"prompt_token_ids[{i}]", f"token id {t} outside the vocabulary (0..{vocab_size - 1})"
            )


def stop_index(text: str, stops: list[str], new_from: int) -> int | None:
    """Where the earliest stop string starts, if one ends at or after ``new_from``."""
    best: int | None = None
    for s in stops:
        i = text.find(s, max(0, new_from - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best


#: the retry hint sent with a full queue (ms), unless the engine config says otherwise
DEFAULT_RETRY_AFTER_MS = 1000.0


def queue_full(depth: int, limit: int, retry_after_ms: float = DEFAULT_RETRY_AFTER_MS) -> ResourceExhausted:
    return ResourceExhausted(
        f"engine queue is full ({depth} waiting, limit {limit}); retry later", retry_after_ms=retry_after_ms
    )


def expired(gen: Generation, where: str) -> DeadlineExceeded:
    """The request's deadline passed ``where`` ("in the queue", "after N tokens"): it leaves the engine."""
    return DeadlineExceeded(f"deadline exceeded {where}")
