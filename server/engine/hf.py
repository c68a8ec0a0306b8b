"""The transformers engine: torch + transformers on CPU or CUDA, continuous batching.

One worker thread owns the model; the event loop only tokenizes, enqueues and hands
tokens to the front ends, so it stays responsive while the model runs.

Scheduling (continuous batching over a shared, left-padded KV cache):

- ``generate()`` validates, tokenizes (so a context-length error is raised at once),
  and appends the request to a bounded waiting queue (``max_queue`` → ResourceExhausted).
- When nothing runs, the worker waits up to ``max_wait_ms`` for up to
  ``max_batch_size`` requests (dynamic batching window), then prefills them together.
- While a batch runs, each iteration first admits waiting requests into free slots
  (one batched, left-padded prefill; their KV rows are merged into the running cache),
  then runs one decode step for every running request. A request leaves the batch as
  soon as it finishes or its front end goes away (its cache row is dropped at once), so
  a slot frees without waiting for the rest of the batch. Requests wait in the queue
  (``srv.queue`` grows) only when every slot is taken.

Timing per request (ms): ``tokenize`` (in ``generate()``), ``queue`` (enqueued →
admitted), ``prefill`` (the batched prefill forward that produced its first token),
``decode_steps`` (every model forward that ran while it was in the batch after its
prefill, including other requests' prefills that stalled the batch, since that time is
inference work its tokens waited for), ``detokenize`` (incremental detokenization and
stop-string checks).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pathprobe.engineoptions import TransformersOptions, padding
from pathprobe.errors import ConfigError, PathprobeError, Unavailable
from pathprobe.server.engine.base import (
    Engine,
    EngineConfig,
    Generation,
    GenParams,
    TokenEvent,
    expired,
    queue_full,
    stop_index,
)
from pathprobe.server.engine.hfstatic import StaticBatch, StaticSettings
from pathprobe.server.engine.prefix import Hit, PrefixCache, PrefixCacheOptions
from pathprobe.server.engine.torchtypes import Dtype, Generator, KvCache, Model, Tensor
from pathprobe.server.startup import StartupTimer
from pathprobe.timing import now_ms

if TYPE_CHECKING:  # pragma: no cover
    from pathprobe.models import ResolvedModel
    from pathprobe.models.tokenizer_build import SlowByteLevelBPE, SlowSentencePiece

log = logging.getLogger(__name__)


#: phases timed inside ``_load`` (the rest of ``start`` is booked as engine_other)
_LOAD_PHASES = (
    "weights_read",
    "weights_init",
    "device_transfer",
    "fuse",
    "quantize",
    "warmup",
    "cuda_graphs",
    "graph_warm",
)


#: seed of a weightless folder's random weights (presets), so two loads are the same model
PRESET_SEED = 0


_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "f32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}


def _threads_option(value: int | None, device: str) -> int | None:
    """torch intra-op threads: ``--engine-option threads=N``; on the CPU the default is 1.

    Measured on a 2-core box running the server beside its load generator and gateways:
    the tiny model's decode step took 2.4 ms with one thread and 53 ms with two (OpenMP
    workers spinning against the other processes), so more threads only pay off when
    the server has cores to itself. ``threads=0`` keeps torch's own default.
    """
    if value is None:
        return 1 if not device.startswith("cuda") else None
    return value or None  # checked (>= 0) with the options


def pick_device(device: str) -> str:
    import torch

    if device in ("", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device: {device!r} asked for but CUDA is not available")
    if device != "cpu" and not device.startswith("cuda"):
        raise ConfigError(f"device: unknown device {device!r} (cpu, cuda, cuda:N, auto)")
    return device


def pick_dtype(dtype: str, device: str) -> Dtype:
    import torch

    if dtype in ("", "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    name = _DTYPES.get(dtype.lower())
    if name is None:
        raise ConfigError(f"dtype: unknown dtype {dtype!r} (float32, bfloat16, float16, auto)")
    return getattr(torch, name)


class IncrementalDetokenizer:
    """Turns token ids into text deltas one at a time (byte-level BPE safe).

    Holds back text while the tail is an incomplete UTF-8 sequence (decodes to U+FFFD),
    the way vLLM and TGI do: decode a short window before and after the new token and
    emit the difference.
    """

    def __init__(self, decode) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def add(self, token: int) -> str:
        self.ids.append(token)
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        new_text = self._decode(self.ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        prefix_text = self._decode(self.ids[self._prefix : self._read])
        new_text = self._decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return new_text[len(prefix_text) :] if len(new_text) > len(prefix_text) else ""


def holdback(text: str, stops: list[str]) -> int:
    """How many trailing chars might be the start of a stop string (not sent yet)."""
    n = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), n, -1):
            if text.endswith(s[:k]):
                n = k
                break
    return n


#: what the worker hands a request's loop: a token, an error, or None when it is done
_Item = TokenEvent | BaseException | None


@dataclass(eq=False)
class _Req:
    gen: Generation
    ids: list[int]
    loop: asyncio.AbstractEventLoop
    detok: IncrementalDetokenizer
    generator: Generator = None
    out: list[int] = field(default_factory=list)
    text: str = ""
    sent: int = 0  # chars of text already handed out
    n_pos: int = 0  # tokens in the KV cache for this row (prompt + fed outputs)
    last: int = 0  # last sampled token (next decode input)
    done: bool = False
    finished: bool = False  # ended by its own finish (stop, length), not cancelled or expired
    slot: int = -1  # static mode: the KV row this request owns


class TransformersEngine(Engine):
    def __init__(self, config: EngineConfig, model: ResolvedModel | None = None) -> None:
        from pathprobe import models

        self.config = config
        self.startup = StartupTimer()
        with self.startup.phase("imports"):
            import torch
            from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast  # noqa: F401
        ref = model or models.resolve(config.model, config.model_name)
        self.startup.record("model_folder", ref.started_ms, ref.took_ms)  # resolved once, by the server
        self._folder = ref.folder
        with self.startup.phase("tokenizer"):
            self.tokenizer = models.load_tokenizer(ref)
        opts = config.typed_options
        if not isinstance(opts, TransformersOptions):
            raise ConfigError(f"--engine-option: {type(opts).__name__} given to the transformers engine")
        self.options = opts
        tok_kind = opts.tokenizer
        self._slow: SlowByteLevelBPE | SlowSentencePiece | None = None  # the slow (Python) encoder, when asked for
        if tok_kind == "slow":
            with self.startup.phase("tokenizer_slow"):
                self._slow = models.load_slow_tokenizer(ref)
        self.tokenizer_kind = tok_kind
        self.model_name = ref.name
        self.device = pick_device(config.device)
        self.dtype = pick_dtype(config.dtype, self.device)
        self.model: Model = None
        self.max_context = 0
        self._vocab = len(self.tokenizer)
        self._eos: set[int] = set()
        self._cond = threading.Condition()
        self._waiting: collections.deque[_Req] = collections.deque()
        self._running = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._graphs = opts.cuda_graphs
        self._static_opt = self._graphs or opts.static_cache
        if self._graphs and not self.device.startswith("cuda"):
            raise ConfigError("--engine-option cuda_graphs: needs a CUDA device (use static_cache=1 on the CPU)")
        self._static: StaticBatch | None = None
        self._static_wait_ms = opts.static_wait_ms
        self._threads = _threads_option(opts.threads, self.device)
        self._batching = opts.batching
        self._pad_mode, self._pad_to = padding(opts.pad)
        self._compile = opts.compile
        self._fuse = opts.fuse  # one GEMM for QKV and one for gate/up (server/engine/fuse.py)
        # replay every captured graph once at start-up (a graph's first launch is slower)
        self._graph_warm = opts.graph_warm
        self._quant = opts.quant  # weight-only quantization (torchao)
        # torch's cuDNN attention backend: off by default on CUDA (on an H200 it built a plan for
        # each new eager prefill shape, 55-95 ms on the shape's first call; 2026-12-02 result)
        self._cudnn_sdp = opts.cudnn_sdp
        # after start-up, move every object made so far out of the collector's generations
        # (gc.freeze): a full collection then no longer walks the model's and libraries' objects
        self._gc_freeze = opts.gc_freeze
        # static prefill (graphs on CUDA): prompts up to prefill_max_len tokens, at most
        # prefill_max_batch newcomers at once (more go through one batched eager prefill)
        self._prefill_max_len = opts.prefill_max_len if opts.prefill_max_len is not None else 512 if self._graphs else 0
        self._prefill_max_batch = opts.prefill_max_batch
        self._experts = opts.experts  # transformers' experts_implementation for MoE models
        # prefix caching (dynamic KV cache only): set up in _load once the model's layers are known
        self._prefix_opts = PrefixCacheOptions.parse(opts.prefix_cache, opts.prefix_cache_mb, opts.prefix_cache_entries)
        self.prefix_cache: PrefixCache | None = None
        if self.device.startswith("cuda"):
            import torch

            self.startup.sync = torch.cuda.synchronize
        #: counters for tests and /metrics: decode steps, tokens made, requests cancelled
        self.stats = {
            "prefills": 0,
            "static_prefills": 0,
            "decode_steps": 0,
            "tokens": 0,
            "cancelled": 0,
            "finished": 0,
            "prefill_tokens": 0,  # prompt tokens the model computed
            "cached_tokens": 0,  # prompt tokens whose KV came from the prefix cache
        }

    # --- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        t0 = now_ms()
        await asyncio.to_thread(self._load)
        if self._gc_freeze:
            import gc

            gc.collect()
            gc.freeze()
        known = sum(p.ms for p in self.startup.ordered() if p.name in _LOAD_PHASES)
        self.startup.record("engine_other", t0, max(0.0, now_ms() - t0 - known))
        self._thread = threading.Thread(target=self._worker, name="pathprobe-engine", daemon=True)
        self._thread.start()
        if self._static is not None and self._graphs and self._graph_warm:
            await self._warm_request()

    async def _warm_request(self) -> None:
        """One short request through the whole static path (prefill graph, slot placement, sampling,
        decode graph, detokenizing) before serving: on an H200 a fresh engine's first request still
        spent 36-47 ms in a 64-token prefill that takes ~10 ms after it (2026-12-02 result)."""
        n = max(1, min(64, self.max_context // 4))
        with self.startup.phase("warm_request", f"{n} prompt tokens, 2 new"):
            gen = self.generate(GenParams(prompt_token_ids=[self._pad] * n, max_tokens=2, ignore_eos=True))
            await gen.collect()
        self.stats.update(dict.fromkeys(self.stats, 0))  # the counters count requests served

    def encode_prompt(self, text: str) -> list[int]:
        """Prompt text -> token ids: the slow encoder when ``--engine-option tokenizer=slow``."""
        if self._slow is not None:
            return self._slow.encode(text, bos=self.tokenizer.bos_token_id)
        return super().encode_prompt(text)

    def _read_weights(self) -> None:
        """Read the weight files once, bytes only (disk -> page cache), timed on their own."""
        from pathprobe.models import WEIGHT_PATTERNS

        files = [p for pat in WEIGHT_PATTERNS for p in sorted(self._folder.glob(pat))]
        n = 0
        with self.startup.phase("weights_read") as ph:
            for f in files:
                with open(f, "rb") as fh:
                    while chunk := fh.read(1 << 24):
                        n += len(chunk)
            ph.note = f"{n / 1e6:.1f} MB in {len(files)} file(s)"

    def _load(self) -> None:
        import torch
        from pathprobe.models import has_weights
        from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

        if self._threads:
            torch.set_num_threads(self._threads)
        if self.device.startswith("cuda") and not self._cudnn_sdp:
            torch.backends.cuda.enable_cudnn_sdp(False)  # the engine owns its process
        folder = str(self._folder)
        extra = {"experts_implementation": self._experts} if self._experts else {}
        try:
            if has_weights(self._folder):
                self._read_weights()
                with self.startup.phase("weights_init", "from_pretrained on the CPU"):
                    model = AutoModelForCausalLM.from_pretrained(
                        folder, dtype=self.dtype, local_files_only=True, **extra
                    )
                with self.startup.phase("device_transfer", self.device):
                    # transformers types PreTrainedModel.to through a decorator whose stub takes the model
                    model.to(self.device)  # type: ignore[arg-type]
            else:  # a preset: published architecture, random weights made here
                cfg = AutoConfig.from_pretrained(folder, local_files_only=True)
                cuda = [torch.device(self.device).index or 0] if self.device.startswith("cuda") else []
                with (
                    self.startup.phase("weights_init", f"random init on {self.device}, no weight files"),
                    torch.random.fork_rng(devices=cuda),
                    torch.device(self.device),
                ):
                    torch.manual_seed(PRESET_SEED)  # the same random weights on every load
                    model = AutoModelForCausalLM.from_config(cfg, dtype=self.dtype, **extra)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model: cannot load {folder}: {exc}") from exc
        model.eval()
        if self._fuse:
            from pathprobe.server.engine.fuse import fuse_projections

            with self.startup.phase("fuse") as ph:
                ph.note = fuse_projections(model)
        if self._quant != "none":
            from pathprobe.server.engine.quant import quantize

            with self.startup.phase("quantize") as ph:
                ph.note = quantize(model, self._quant, self.device)
        self.model = model
        # transformers >= 5.2x names the KV cache argument ``cache``; older ones ``past_key_values``
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        mcfg = model.config
        self.max_context = self.config.max_context or int(getattr(mcfg, "max_position_embeddings", 2048))
        self._vocab = min(len(self.tokenizer), int(mcfg.vocab_size))
        self._model_vocab = int(mcfg.vocab_size)
        eos: set[int] = set()
        try:
            gc = GenerationConfig.from_pretrained(folder, local_files_only=True)
            e = gc.eos_token_id
            eos.update(e if isinstance(e, list) else [e] if e is not None else [])
        except OSError:
            pass
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self._eos = eos
        if self._static_opt:
            max_len = self.options.static_max_len or min(self.max_context, 2048)
            self.max_context = min(self.max_context, max_len)
        pad = self.tokenizer.pad_token_id
        self._pad = pad if pad is not None else (min(eos) if eos else 0)
        backend = getattr(self.tokenizer, "_tokenizer", None)
        if backend is not None and hasattr(backend, "decode"):
            self._decode = lambda ids: backend.decode(ids, skip_special_tokens=True)
        else:
            self._decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True)
        # warm-up: tokenizer, one tiny prefill + decode, so the first request pays no lazy init
        with self.startup.phase("warmup"):
            self._decode(self.encode_prompt("warm up"))
            with torch.inference_mode():
                from transformers import DynamicCache

                ids = torch.tensor([[self._pad, self._pad]], device=self.device)
                warm = DynamicCache(config=model.config)
                model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._cache_kw: warm})
                model(input_ids=ids[:, :1], use_cache=True, logits_to_keep=1, **{self._cache_kw: warm})
        if self._static_opt:
            note = "static KV cache and graph capture" if self._graphs else "static KV cache only"
            with self.startup.phase("cuda_graphs", note), torch.inference_mode():
                settings = StaticSettings(
                    model=self.model,
                    device=self.device,
                    cache_kw=self._cache_kw,
                    pad=self._pad,
                    compile=self._compile,
                    compile_mode=self.options.compile_mode,
                    compile_fullgraph=self.options.compile_fullgraph,
                    compile_tune=self.options.compile_tune,
                    compile_cache=self.options.compile_cache,
                    prefill_max_len=self._prefill_max_len,
                    prefill_max_batch=self._prefill_max_batch,
                )
                self._static = StaticBatch(settings, self.config.max_batch_size, self.max_context, self._graphs)
            if self._graphs and self._graph_warm:
                with self.startup.phase("graph_warm") as ph, torch.inference_mode():
                    ph.note = f"each captured graph replayed once: {self._static.warm()} graphs"
        self.prefix_cache = self._make_prefix_cache()
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def _make_prefix_cache(self) -> PrefixCache | None:
        """The prefix cache, where it is asked for and exact: the dynamic KV cache (the static one
        keeps its own slots) of a model whose layers all keep every position (no sliding window)."""
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        opts = self._prefix_opts
        if not opts.enabled or self._static_opt:
            return None
        probe = DynamicCache(config=self.model.config)
        if not probe.layers or any(type(layer) is not DynamicLayer for layer in probe.layers):
            log.info("prefix cache off: the model's cache has layers that drop positions")
            return None
        return PrefixCache(int(opts.max_mb * 2**20), opts.max_entries)

    async def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)
        with self._cond:
            left = list(self._waiting)
            self._waiting.clear()
        for r in left:
            r.gen.fail(Unavailable("server shutting down"))

    # --- front-end side ---------------------------------------------------------------
    def queue_depth(self) -> int:
        return len(self._waiting)

    def running(self) -> int:
        return self._running

    def generate(self, params: GenParams) -> Generation:
        if self._loop is None or self.model is None:
            raise Unavailable("engine not started")
        gen, ids = self.prepare(params)
        t = gen.timing
        req = _Req(gen=gen, ids=ids, loop=asyncio.get_running_loop(), detok=IncrementalDetokenizer(self._decode))
        with self._cond:
            if self._stopping:
                raise Unavailable("server shutting down")
            if len(self._waiting) >= self.config.max_queue:
                raise queue_full(len(self._waiting), self.config.max_queue)
            t.queue_start = now_ms()
            self._waiting.append(req)
            self._cond.notify_all()
        gen.on_close = self._wake  # a closed request leaves the queue / its slot at the next step
        return gen

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # --- worker thread ------------------------------------------------------------------
    def _deliver(self, loop: asyncio.AbstractEventLoop, items: list[tuple[Generation, _Item]]) -> None:
        def run() -> None:
            for gen, item in items:
                if item is None:
                    gen.finish()
                elif isinstance(item, BaseException):
                    gen.fail(item)
                else:
                    gen.push(item)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # loop closed: nobody is listening any more
            pass

    def _admit(self, running: list[_Req]) -> list[_Req]:
        """Take waiting requests into free slots (blocking while there is nothing to do)."""
        cfg = self.config
        with self._cond:
            while not self._stopping and not running and not self._waiting:
                self._cond.wait()
            if self._stopping:
                return []
            if running and self._batching != "continuous":
                return []  # request-level batching: nobody joins a running batch
            if not running and self._waiting:
                # batching window: wait for companions, at most max_wait_ms (static: the fill timeout)
                window = cfg.max_wait_ms if self._batching != "static" else self._static_wait_ms
                deadline = self._waiting[0].gen.timing.queue_start + window
                while not self._stopping and len(self._waiting) < cfg.max_batch_size:
                    left = deadline - now_ms()
                    if left <= 0:
                        break
                    self._cond.wait(left / 1000.0)
            new: list[_Req] = []
            dropped: list[_Req] = []
            now = now_ms()
            expired_: list[_Req] = [
                r
                for r in self._waiting
                if r.gen.params.deadline_ms and now >= r.gen.params.deadline_ms and not r.gen.cancelled
            ]
            for r in expired_:  # past its deadline while waiting: leaves the queue without generating
                self._waiting.remove(r)
            while self._waiting and len(running) + len(new) < cfg.max_batch_size:
                r = self._waiting[0]
                if not r.gen.cancelled and self._static is not None and not self._static.fits(r, running, new):
                    break  # static cache: waits until the columns it needs are free (FIFO)
                self._waiting.popleft()
                (dropped if r.gen.cancelled else new).append(r)
            self._running = len(running) + len(new)
        for r in dropped:
            self.stats["cancelled"] += 1
            self._deliver(r.loop, [(r.gen, None)])
        for r in expired_:
            r.gen.timing.queue = now - r.gen.timing.queue_start
            self._deliver(r.loop, [(r.gen, expired(r.gen, f"in the queue after {r.gen.timing.queue:.0f} ms"))])
        return new

    def _worker(self) -> None:
        import torch

        running: list[_Req] = []
        cache: KvCache = None
        mask: Tensor = None
        with torch.inference_mode():
            while True:
                new = self._admit(running)
                if self._stopping:
                    break
                try:
                    if new:
                        cache, mask = self._prefill(new, running, cache, mask)
                        running = running + new
                        running, cache, mask = self._compact(running, cache, mask)
                    if running:
                        mask = self._decode_step(running, cache, mask)
                        running, cache, mask = self._compact(running, cache, mask)
                except Exception as exc:
                    log.exception("engine step failed")
                    err = PathprobeError(f"engine error: {type(exc).__name__}: {exc}")
                    for r in running + new:
                        if not r.done:
                            r.done = True
                            self._deliver(r.loop, [(r.gen, err)])
                        if self._static is not None:
                            self._static.release(r)
                    running, cache, mask = [], None, None
                with self._cond:
                    self._running = len(running)
        # shutting down: end what still runs
        for r in running:
            self._deliver(r.loop, [(r.gen, Unavailable("server shutting down"))])
        with self._cond:
            self._running = 0

    def _prefill(self, new: list[_Req], running: list[_Req], cache: KvCache, mask: Tensor) -> tuple[KvCache, Tensor]:
        import torch
        from transformers import DynamicCache

        start = now_ms()
        batch = len(running) + len(new)
        for r in new:
            t = r.gen.timing
            t.queue = start - t.queue_start
            t.prefill_start = start
            t.batch_size = max(t.batch_size, batch)
            r.n_pos = len(r.ids)
            if r.gen.params.temperature > 0:
                r.generator = torch.Generator(device=self.device).manual_seed(int(r.gen.params.seed))
        static = self._static
        if static is not None and static.can_prefill(new):
            # one static (on CUDA: graph-replayed) prefill per newcomer, KV written straight into its slot
            tokens = self._sample(static.prefill(new, running), new)
            self.stats["static_prefills"] += len(new)
            ncache = None
        else:
            hits = self._prefix_hits(new)
            misses = [r for r in new if r not in hits]
            new[:] = misses + list(hits)  # the caller appends ``new`` to the batch in this row order
            tokens, parts = [], []
            if misses:
                width = self._prefill_width(max(len(r.ids) for r in misses))
                ids = torch.full((len(misses), width), self._pad, dtype=torch.long)
                nmask = torch.zeros((len(misses), width), dtype=torch.long)
                for i, r in enumerate(misses):
                    n = len(r.ids)
                    ids[i, width - n :] = torch.tensor(r.ids, dtype=torch.long)
                    nmask[i, width - n :] = 1
                ids, nmask = ids.to(self.device), nmask.to(self.device)
                pos = (nmask.cumsum(-1) - 1).clamp(min=0)
                ncache = DynamicCache(config=self.model.config)
                out = self.model(
                    input_ids=ids,
                    attention_mask=nmask,
                    position_ids=pos,
                    use_cache=True,
                    logits_to_keep=1,
                    **{self._cache_kw: ncache},
                )
                tokens += self._sample(out.logits[:, -1, :], misses)
                for r in misses:
                    r.gen.timing.prefill_path = f"eager:{len(misses)}x{width}"
                self.stats["prefill_tokens"] += sum(len(r.ids) for r in misses)
                parts.append((ncache, nmask))
            if hits:  # together: each row's cached prefix, then its new tokens (one forward)
                toks, hcache, hmask = self._prefill_hits(hits)
                tokens += toks
                parts.append((hcache, hmask))
            ncache, nmask = parts[0]
            for c, m in parts[1:]:
                ncache, nmask = _merge(ncache, nmask, c, m)
        end = now_ms()
        self.stats["prefills"] += 1
        for r in running:  # the batch stalled while the newcomers prefilled
            r.gen.timing.decode_steps += end - start
            r.gen.timing.batch_size = max(r.gen.timing.batch_size, batch)
        if static is not None and ncache is not None:
            static.place(new, running, ncache, width)
        events = []
        for r, tok in zip(new, tokens):
            r.gen.timing.prefill = end - start
            r.gen.timing.decode_start = end
            events.append(self._emit(r, tok))
        self._deliver_events(new, events)
        if static is not None:
            return None, None
        if cache is None:
            return ncache, nmask
        return _merge(cache, mask, ncache, nmask)

    def _prefix_hits(self, new: list[_Req]) -> dict[_Req, Hit]:
        """The newcomers whose prompt starts with a cached prefix, with that prefix (a ``Hit``)."""
        pc = self.prefix_cache
        if pc is None:
            return {}
        hits = {}
        for r in new:
            hit = pc.lookup(r.ids)
            if hit is not None:
                hits[r] = hit
        return hits

    def _prefill_hits(self, hits: dict[_Req, Hit]) -> tuple[list[int], KvCache, Tensor]:
        """Prefill the newcomers that start with a cached prefix in one forward: a left-padded cache of
        their prefixes' KV (copied, so the entries stay as they were), then their new tokens.

        One forward's input is as wide for every row: the longest run of new tokens (``m``). A row with
        fewer new tokens takes only the first ``len - m`` of its cached prefix and computes the rest
        again, so every row's tokens stay contiguous at the right (the layout the decode steps and
        :meth:`_keep_prefix` read); its ``cached_tokens`` are those it took. Each hit alone, one forward
        each, cost a whole eager forward per hit (35-45 ms on the GPU for the 8B shape, whatever the
        tokens): 2-3x the uncached batched prefill with 4 conversations (docs/results,
        2026-12-03-gpu-fourth-pass)."""
        import torch
        from transformers import DynamicCache

        rows = list(hits)
        m = max(len(r.ids) - hits[r].tokens for r in rows)
        used = [max(0, len(r.ids) - m) for r in rows]  # each row's cached tokens taken
        width = max(used)
        hcache = DynamicCache(config=self.model.config)
        layers: list[KvCache] = list(hcache.layers)  # plain DynamicLayers (_make_prefix_cache checked)
        for li, layer in enumerate(layers):
            keys, values = [], []
            for r, c in zip(rows, used, strict=True):
                k, v = hits[r].kv[li]
                k, v = k[:, :, :c, :], v[:, :, :c, :]
                if c < width:
                    b, h, _, d = k.shape
                    k = torch.cat([k.new_zeros((b, h, width - c, d)), k], dim=2)
                    v = torch.cat([v.new_zeros((b, h, width - c, d)), v], dim=2)
                keys.append(k)
                values.append(v)
            layer.update(torch.cat(keys), torch.cat(values))
        ids = torch.full((len(rows), m), self._pad, dtype=torch.long)
        hmask = torch.zeros((len(rows), width + m), dtype=torch.long)
        for i, (r, c) in enumerate(zip(rows, used, strict=True)):
            n = len(r.ids) - c  # its tokens to compute: m, or its whole prompt when shorter than m
            ids[i, m - n :] = torch.tensor(r.ids[c:], dtype=torch.long)
            hmask[i, width - c : width] = 1
            hmask[i, width + m - n :] = 1
        ids, hmask = ids.to(self.device), hmask.to(self.device)
        pos = (hmask.cumsum(-1) - 1).clamp(min=0)[:, width:]
        out = self.model(
            input_ids=ids,
            attention_mask=hmask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: hcache},
        )
        for r, c in zip(rows, used, strict=True):
            r.gen.timing.cached_tokens = c
            r.gen.timing.prefill_path = f"cached:{c}+{len(r.ids) - c}" + (
                f" ({len(rows)} rows)" if len(rows) > 1 else ""
            )
            self.stats["prefill_tokens"] += len(r.ids) - c
            self.stats["cached_tokens"] += c
        return self._sample(out.logits[:, -1, :], rows), hcache, hmask

    def _keep_prefix(self, rows: list[tuple[int, _Req]], cache: KvCache, width: int) -> None:
        """Put finished rows' KV (prompt and the outputs fed back) into the prefix cache."""
        pc = self.prefix_cache
        if pc is None:
            return
        for i, r in rows:
            n = r.n_pos  # the row's tokens are the cache's last n columns (left padding)
            if not r.finished or n != len(r.ids) + len(r.out) - 1 or n > width:
                continue
            kv = [
                (layer.keys[i : i + 1, :, width - n :, :].clone(), layer.values[i : i + 1, :, width - n :, :].clone())
                for layer in cache.layers
            ]
            pc.store((r.ids + r.out)[:n], kv)

    def _prefill_width(self, longest: int) -> int:
        """Columns of a batched prefill: the longest prompt, a power-of-two bucket, or a fixed length."""
        if self._pad_mode == "bucket":
            width = max(16, 1 << (longest - 1).bit_length())
        elif self._pad_mode == "fixed":
            width = max(self._pad_to, longest)
        else:
            return longest
        return min(width, self.max_context)

    def _decode_step(self, running: list[_Req], cache: KvCache, mask: Tensor) -> Tensor:
        import torch

        start = now_ms()
        if self._static is not None:
            step_mask = None
            logits = self._static.step(running)
        else:
            ids = torch.tensor([[r.last] for r in running], dtype=torch.long, device=self.device)
            pos = torch.tensor([[r.n_pos] for r in running], dtype=torch.long, device=self.device)
            step_mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            out = self.model(
                input_ids=ids,
                attention_mask=step_mask,
                position_ids=pos,
                use_cache=True,
                logits_to_keep=1,
                **{self._cache_kw: cache},
            )
            logits = out.logits[:, -1, :]
        tokens = self._sample(logits, running)
        dur = now_ms() - start
        self.stats["decode_steps"] += 1
        events = []
        for r, tok in zip(running, tokens):
            r.n_pos += 1
            t = r.gen.timing
            t.decode_steps += dur
            t.batch_size = max(t.batch_size, len(running))
            events.append(self._emit(r, tok))
        self._deliver_events(running, events)
        return step_mask

    def _deliver_events(self, reqs: list[_Req], events: list[TokenEvent | None]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Generation, _Item]]] = {}
        for r, ev in zip(reqs, events):
            if ev is None:
                continue
            items = by_loop.setdefault(r.loop, [])
            items.append((r.gen, ev))
            if r.done:
                items.append((r.gen, None))
        for loop, items in by_loop.items():
            self._deliver(loop, items)

    def _sample(self, logits: Tensor, reqs: list[_Req]) -> list[int]:
        import torch

        logits = logits.float()
        if self._model_vocab > self._vocab:  # ids the tokenizer cannot spell (presets)
            logits[:, self._vocab :] = float("-inf")
        tokens = logits.argmax(dim=-1).tolist()
        for i, r in enumerate(reqs):
            p = r.gen.params
            if p.temperature <= 0:
                continue
            probs = torch.softmax(logits[i] / p.temperature, dim=-1)
            if p.top_p < 1.0:
                sp, si = torch.sort(probs, descending=True)
                cut = (sp.cumsum(-1) - sp) >= p.top_p
                sp[cut] = 0.0
                choice = torch.multinomial(sp, 1, generator=r.generator)
                tokens[i] = int(si[choice].item())
            else:
                tokens[i] = int(torch.multinomial(probs, 1, generator=r.generator).item())
        return tokens

    def _emit(self, r: _Req, tok: int) -> TokenEvent | None:
        """Account one new token of ``r``: text delta, stop checks, finish reason."""
        p, t = r.gen.params, r.gen.timing
        if r.gen.cancelled:  # _compact drops the row and ends the Generation
            return None
        d0 = now_ms()
        r.out.append(tok)
        r.last = tok
        self.stats["tokens"] += 1
        finish: str | None = None
        if tok in self._eos and not p.ignore_eos:
            r.text += r.detok.flush()
            piece = r.text[r.sent :]
            finish = "stop"
        else:
            before = len(r.text)
            r.text += r.detok.add(tok)
            at_end = len(r.out) >= p.max_tokens
            if at_end:
                r.text += r.detok.flush()
            cut = stop_index(r.text, p.stop, before) if p.stop else None
            if cut is not None:
                piece = r.text[r.sent : cut] if cut >= r.sent else ""
                r.text = r.text[:cut]
                finish = "stop"
            elif at_end:
                piece = r.text[r.sent :]
                finish = "length"
            else:
                keep = holdback(r.text, p.stop) if p.stop else 0
                piece = r.text[r.sent : len(r.text) - keep]
        r.sent += len(piece)
        if finish:
            r.done = True
            r.finished = True
            self.stats["finished"] += 1
        t.detokenize += now_ms() - d0
        return TokenEvent(piece, [tok], finish)

    def _compact(self, running: list[_Req], cache: KvCache, mask: Tensor) -> tuple[list[_Req], KvCache, Tensor]:
        """Drop finished / cancelled rows from the batch and trim all-padding columns."""
        import torch

        now = now_ms()
        for r in running:
            if not r.done and r.gen.cancelled:
                r.done = True
                self.stats["cancelled"] += 1
                self._deliver(r.loop, [(r.gen, None)])
            elif not r.done and r.gen.params.deadline_ms and now >= r.gen.params.deadline_ms:
                r.done = True  # the caller stopped waiting: out of the batch before the next step
                self.stats["expired"] = self.stats.get("expired", 0) + 1
                self._deliver(r.loop, [(r.gen, expired(r.gen, f"after {r.gen.completion_tokens} tokens"))])
        keep = [i for i, r in enumerate(running) if not r.done]
        if len(keep) == len(running):
            return running, cache, mask
        if self._static is not None:
            for r in running:
                if r.done:
                    self._static.release(r)
            return [r for r in running if not r.done], None, None
        self._keep_prefix([(i, r) for i, r in enumerate(running) if r.done], cache, mask.shape[1])
        if not keep:
            return [], None, None
        idx = torch.tensor(keep, device=mask.device)
        mask = mask.index_select(0, idx)
        # leading columns no remaining row attends to
        used = mask.any(dim=0).nonzero()
        first = int(used[0].item()) if used.numel() else 0
        mask = mask[:, first:]
        for layer in cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[:, :, first:, :]
            layer.values = layer.values.index_select(0, idx)[:, :, first:, :]
        return [running[i] for i in keep], cache, mask


def _merge(cache: KvCache, mask: Tensor, ncache: KvCache, nmask: Tensor) -> tuple[KvCache, Tensor]:
    """Stack two left-padded caches into one (the shorter one is padded on the left)."""
    import torch

    la, lb = mask.shape[1], nmask.shape[1]
    width = max(la, lb)

    def pad_mask(m: Tensor, n: int) -> Tensor:
        return m if n == width else torch.cat([m.new_zeros((m.shape[0], width - n)), m], dim=1)

    def pad_kv(x: Tensor, n: int) -> Tensor:
        if n == width:
            return x
        b, h, _, d = x.shape
        return torch.cat([x.new_zeros((b, h, width - n, d)), x], dim=2)

    for la_layer, lb_layer in zip(cache.layers, ncache.layers):
        la_layer.keys = torch.cat([pad_kv(la_layer.keys, la), pad_kv(lb_layer.keys, lb)], dim=0)
        la_layer.values = torch.cat([pad_kv(la_layer.values, la), pad_kv(lb_layer.values, lb)], dim=0)
    return cache, torch.cat([pad_mask(mask, la), pad_mask(nmask, lb)], dim=0)
