"""The transformers engine's static KV cache: one preallocated cache for every batch slot, filled
in place, so a decode step's shapes never change and it can be captured as a CUDA graph (with
``cuda_graphs``; ``static_cache`` alone uses the same cache without graphs)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pathprobe.server.engine.base import Generation
from pathprobe.server.engine.torchtypes import CudaGraph, Dtype, KvCache, Model, ModelConfig, Tensor


@dataclass(frozen=True, slots=True)
class StaticSettings:
    """What the static cache needs of the engine, handed down once it has loaded its model (no
    reference back to the engine)."""

    model: Model  # the loaded torch model
    device: str
    cache_kw: str  # the forward's KV-cache argument: "cache" or "past_key_values" (transformers' version)
    pad: int  # the pad token id of left-padded prompts
    compile: bool = False  # torch.compile the decode step
    compile_mode: str = "default"  # its torch.compile mode
    compile_fullgraph: bool = False  # one graph for the whole forward (a break is an error)
    compile_tune: bool = False  # inductor's coordinate-descent tuning
    compile_cache: str | None = None  # inductor's (and triton's) cache folder, kept across starts
    prefill_max_len: int = 0  # static prefill: prompts up to this many tokens (0: off)
    prefill_max_batch: int = 4  # static prefill: at most this many newcomers at once


class SlotRequest(Protocol):
    """What the static cache reads and writes of a running request (the engine's ``_Req``)."""

    gen: Generation
    ids: list[int]  # the prompt's token ids
    out: list[int]  # tokens generated so far
    last: int  # the last sampled token (the next decode input)
    n_pos: int  # tokens in the KV cache for this row
    slot: int  # the KV row this request owns (-1: none)


def kv_head_dims(cfg: ModelConfig) -> tuple[int, int]:
    """Per-head key and value sizes in the KV cache (they differ with MLA, e.g. DeepSeek-V2)."""
    if getattr(cfg, "qk_rope_head_dim", None):
        return int(cfg.qk_nope_head_dim) + int(cfg.qk_rope_head_dim), int(cfg.v_head_dim)
    hd = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    return hd, hd


class _SlotCache:
    """A KV cache view over the first ``b`` rows of preallocated static tensors.

    The model calls ``update`` once per layer per forward; the new keys/values go into
    column ``col`` (a device tensor, so a captured CUDA graph reads its current value)
    and the whole row width is returned; a 4D boolean mask picks the valid columns.
    """

    is_compileable = False

    def __init__(self, keys: list[Tensor], values: list[Tensor], col: Tensor, b: int, width: int) -> None:
        self.keys = [k[:b, :, :width] for k in keys]
        self.values = [v[:b, :, :width] for v in values]
        self.col = col

    def update(
        self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[Tensor, Tensor]:
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.index_copy_(2, self.col, key_states)
        v.index_copy_(2, self.col, value_states)
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.keys[0].shape[2]

    def get_mask_sizes(self, *args: object, **kwargs: object) -> tuple[int, int]:
        return self.keys[0].shape[2], 0


class _ScratchLayer:
    def __init__(self, keys: Tensor, values: Tensor) -> None:
        self.keys, self.values = keys, values


class _ScratchCache:
    """A one-forward KV cache over preallocated tensors (a static prefill): the model's
    keys/values for the whole prompt bucket are copied in, then moved into a slot."""

    is_compileable = False

    def __init__(self, keys: list[Tensor], values: list[Tensor]) -> None:
        self.layers = [_ScratchLayer(k, v) for k, v in zip(keys, values)]

    def update(
        self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[Tensor, Tensor]:
        layer = self.layers[layer_idx]
        layer.keys.copy_(key_states)
        layer.values.copy_(value_states)
        return layer.keys, layer.values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_mask_sizes(self, *args: object, **kwargs: object) -> tuple[int, int]:
        return self.layers[0].keys.shape[2], 0


def compiled(model: Model, settings: StaticSettings) -> Model:
    """``model`` under torch.compile as the settings ask (the decode step; graphs are captured after)."""
    import os

    import torch
    import torch._dynamo
    import torch._inductor.config

    if settings.compile_cache:  # read by inductor whenever it looks for its cache (and triton's under it)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(settings.compile_cache)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if settings.compile_tune:
        torch._inductor.config.coordinate_descent_tuning = True
    mode = None if settings.compile_mode == "default" else settings.compile_mode
    return torch.compile(model, dynamic=None, fullgraph=settings.compile_fullgraph, mode=mode)


class StaticBatch:
    """Static KV cache + (on CUDA, optionally) one captured CUDA graph per batch bucket.

    Every running request owns one row ("slot") of a ``[slots, kv_heads, L, head_dim]``
    tensor per layer. All rows write the same column ``c`` at each decode step; a
    request's prompt sits in columns ``[c - n, c)`` of its row when it joins, so
    requests still join and leave between steps (continuous batching). When a newcomer
    needs more columns on the left, or the right edge is near, the used columns are
    moved (one copy). The decode step runs the first ``b`` rows, ``b`` the smallest
    bucket (1, 2, 4, …) that covers the highest slot in use.
    """

    def __init__(self, settings: StaticSettings, slots: int, max_len: int, graphs: bool) -> None:
        import torch

        model, dev = settings.model, settings.device
        cfg = model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        layers = int(text_cfg.num_hidden_layers)
        kvh = int(getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads)
        kd, vd = kv_head_dims(text_cfg)
        dtype = next(model.parameters()).dtype
        self.settings = settings
        self.slots, self.L = slots, max_len
        self.keys = [torch.zeros((slots, kvh, max_len, kd), dtype=dtype, device=dev) for _ in range(layers)]
        self.values = [torch.zeros((slots, kvh, max_len, vd), dtype=dtype, device=dev) for _ in range(layers)]
        self.mask = torch.zeros((slots, 1, 1, max_len), dtype=torch.bool, device=dev)
        self.ids = torch.zeros((slots, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((slots, 1), dtype=torch.long, device=dev)
        self.col = torch.zeros((1,), dtype=torch.long, device=dev)
        self.c = 0
        self.free = list(range(slots))
        self.start: dict[int, int] = {}  # slot -> first column of its prompt
        self.buckets = sorted({min(slots, 1 << i) for i in range(slots.bit_length() + 1)})
        # attend only to the first W columns (W a power of two >= the write column): attention
        # reads (and, with grouped KV heads, copies) the whole width, so a full-length width
        # would cost far more than the tokens actually in use
        self.widths = sorted({min(max_len, 64 << i) for i in range(max(1, max_len.bit_length()))})
        self.views = {
            (b, w): _SlotCache(self.keys, self.values, self.col, b, w) for b in self.buckets for w in self.widths
        }
        self._cp = "cache_position" in inspect.signature(model.forward).parameters
        self._call = compiled(model, settings) if settings.compile else model
        self.graphs: dict[tuple[int, int], tuple[CudaGraph, Tensor]] = {}
        # static prefill of one request at a time, prompt left-padded to a power-of-two bucket
        self.prefill_max_batch = settings.prefill_max_batch
        self.p_buckets = [n for n in (16 << i for i in range(12)) if n <= min(settings.prefill_max_len, max_len)]
        self.p_bufs = {n: self._prefill_buffers(n, layers, kvh, kd, vd, dtype, dev) for n in self.p_buckets}
        self.p_graphs: dict[int, tuple[CudaGraph, Tensor]] = {}
        if graphs:
            self._capture()
            self._capture_prefill()

    # --- admission -------------------------------------------------------------------
    def _plan(self, running: Sequence[SlotRequest], joiners: Sequence[SlotRequest]) -> int | None:
        """The column the next step writes after admitting ``joiners``, or None if they don't fit."""
        if running:
            span = self.c - min(self.start[r.slot] for r in running)
            need_right = max(r.gen.params.max_tokens - len(r.out) for r in running)
        else:
            span, need_right = 0, 0
        if joiners:
            span = max(span, max(len(r.ids) for r in joiners))
            need_right = max(need_right, max(r.gen.params.max_tokens for r in joiners))
        return span if span + need_right <= self.L else None

    def fits(self, r: SlotRequest, running: Sequence[SlotRequest], accepted: Sequence[SlotRequest]) -> bool:
        return len(self.free) > len(accepted) and self._plan(running, [*accepted, r]) is not None

    def place(self, new: Sequence[SlotRequest], running: Sequence[SlotRequest], ncache: KvCache, width: int) -> None:
        """Move used columns if needed, then copy the newcomers' prefill KV into their rows."""
        target = self._plan(running, new)
        assert target is not None, "admitted requests must fit"
        if running and target != self.c:
            lo = min(self.start[r.slot] for r in running)
            shift = target - self.c
            for t in (*self.keys, *self.values):
                t[:, :, lo + shift : target] = t[:, :, lo : self.c].clone()
            m = self.mask[:, :, :, lo : self.c].clone()
            self.mask.zero_()
            self.mask[:, :, :, lo + shift : target] = m
            for r in running:
                self.start[r.slot] += shift
        elif not running:
            self.mask.zero_()
        self.c = target
        for r in new:
            slot = self.free.pop(0)
            r.slot = slot
            n = len(r.ids)
            self.start[slot] = target - n
            self.mask[slot].zero_()
            self.mask[slot, :, :, target - n : target] = True
            i = new.index(r)
            for dst, layer in zip(self.keys, ncache.layers):
                dst[slot, :, target - n : target] = layer.keys[i, :, width - n : width]
            for dst, layer in zip(self.values, ncache.layers):
                dst[slot, :, target - n : target] = layer.values[i, :, width - n : width]
        self.free.sort()

    def release(self, r: SlotRequest) -> None:
        if r.slot >= 0:
            self.free.append(r.slot)
            self.free.sort()
            self.start.pop(r.slot, None)
            self.mask[r.slot].zero_()
            r.slot = -1

    # --- prefill -----------------------------------------------------------------------
    @staticmethod
    def _prefill_buffers(n: int, layers: int, kvh: int, kd: int, vd: int, dtype: Dtype, dev: str) -> dict[str, Tensor]:
        import torch

        return {
            "ids": torch.zeros((1, n), dtype=torch.long, device=dev),
            "pos": torch.zeros((1, n), dtype=torch.long, device=dev),
            "mask": torch.zeros((1, 1, n, n), dtype=torch.bool, device=dev),
            "cp": torch.arange(n, device=dev),
            "cache": _ScratchCache(
                [torch.zeros((1, kvh, n, kd), dtype=dtype, device=dev) for _ in range(layers)],
                [torch.zeros((1, kvh, n, vd), dtype=dtype, device=dev) for _ in range(layers)],
            ),
        }

    def can_prefill(self, new: Sequence[SlotRequest]) -> bool:
        return (
            bool(self.p_buckets)
            and len(new) <= self.prefill_max_batch
            and max(len(r.ids) for r in new) <= self.p_buckets[-1]
        )

    def _prefill_forward(self, n: int) -> Tensor:
        buf = self.p_bufs[n]
        kw: dict[str, object] = {self.settings.cache_kw: buf["cache"]}
        if self._cp:
            kw["cache_position"] = buf["cp"]
        out = self.settings.model(
            input_ids=buf["ids"],
            position_ids=buf["pos"],
            attention_mask=buf["mask"],
            use_cache=True,
            logits_to_keep=1,
            **kw,
        )
        return out.logits[:, -1, :]

    def _load_prompt(self, r: SlotRequest, n: int) -> None:
        import torch

        buf = self.p_bufs[n]
        k = len(r.ids)
        ids = torch.full((1, n), self.settings.pad, dtype=torch.long)
        ids[0, n - k :] = torch.tensor(r.ids, dtype=torch.long)
        pos = torch.zeros((1, n), dtype=torch.long)
        pos[0, n - k :] = torch.arange(k)
        valid = torch.zeros(n, dtype=torch.bool)
        valid[n - k :] = True
        mask = torch.tril(torch.ones((n, n), dtype=torch.bool)) & valid[None, :]
        mask |= torch.eye(n, dtype=torch.bool)  # padding rows attend to themselves (no empty softmax row)
        buf["ids"].copy_(ids)
        buf["pos"].copy_(pos)
        buf["mask"].copy_(mask[None, None])

    def prefill(self, new: Sequence[SlotRequest], running: Sequence[SlotRequest]) -> Tensor:
        """Prefill each newcomer alone in the smallest bucket, place its KV; logits [len(new), vocab]."""
        import torch

        out = []
        placed: list[SlotRequest] = []
        for r in new:
            n = next(b for b in self.p_buckets if b >= len(r.ids))
            self._load_prompt(r, n)
            if n in self.p_graphs:
                graph, logits = self.p_graphs[n]
                graph.replay()
                r.gen.timing.prefill_path = f"graph:{n}"
            else:
                logits = self._prefill_forward(n)
                r.gen.timing.prefill_path = f"static:{n}"
            out.append(logits.clone())
            self.place([r], [*running, *placed], self.p_bufs[n]["cache"], n)
            placed.append(r)
        return torch.cat(out, dim=0)

    def _capture_prefill(self) -> None:
        import torch

        pool = torch.cuda.graph_pool_handle()
        for n in sorted(self.p_buckets, reverse=True):
            buf = self.p_bufs[n]
            buf["mask"].copy_(torch.tril(torch.ones((n, n), dtype=torch.bool, device=buf["mask"].device))[None, None])
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._prefill_forward(n)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._prefill_forward(n)
            self.p_graphs[n] = (graph, logits)
        torch.cuda.synchronize()

    def warm(self) -> int:
        """Replay every captured graph once, so no request pays a graph's first launch (measured on
        an H200: the first replay of a graph costs more than the next ones); returns how many ran.
        Runs against the same harmless state as the capture, then clears the cache again."""
        import torch

        for graph, _ in self.p_graphs.values():
            graph.replay()
        self.mask.zero_()
        self.mask[:, :, :, 0] = True
        self.col.zero_()
        for graph, _ in self.graphs.values():
            graph.replay()
        torch.cuda.synchronize()
        self.mask.zero_()
        for t in (*self.keys, *self.values):
            t.zero_()
        return len(self.p_graphs) + len(self.graphs)

    # --- decode ------------------------------------------------------------------------
    def _forward(self, b: int, w: int) -> Tensor:
        kw: dict[str, object] = {self.settings.cache_kw: self.views[(b, w)]}
        if self._cp:
            kw["cache_position"] = self.col
        out = self._call(
            input_ids=self.ids[:b],
            position_ids=self.pos[:b],
            attention_mask=self.mask[:b, :, :, :w],
            use_cache=True,
            logits_to_keep=1,
            **kw,
        )
        return out.logits[:, -1, :]

    def _capture(self) -> None:
        import torch

        # capture against harmless state: every row attends to column 0 only
        self.mask.zero_()
        self.mask[:, :, :, 0] = True
        self.col.zero_()
        pool = torch.cuda.graph_pool_handle()
        for key in sorted(self.views, reverse=True):  # largest first: it sizes the shared pool
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._forward(*key)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._forward(*key)
            self.graphs[key] = (graph, logits)
        torch.cuda.synchronize()
        self.mask.zero_()
        for t in (*self.keys, *self.values):
            t.zero_()

    def step(self, running: Sequence[SlotRequest]) -> Tensor:
        """One decode step for ``running`` (in its order); returns logits [len(running), vocab]."""
        import torch

        top = max(r.slot for r in running) + 1
        b = next(x for x in self.buckets if x >= top)
        w = next(x for x in self.widths if x > self.c)
        dev = self.ids.device
        slots = torch.tensor([r.slot for r in running], dtype=torch.long).to(dev)
        self.ids[slots, 0] = torch.tensor([r.last for r in running], dtype=torch.long).to(dev)
        self.pos[slots, 0] = torch.tensor([r.n_pos for r in running], dtype=torch.long).to(dev)
        self.col.fill_(self.c)
        self.mask[:b, :, :, self.c] = True  # every row in the bucket attends to the new column (free rows too)
        if (b, w) in self.graphs:
            graph, out = self.graphs[(b, w)]
            graph.replay()
        else:
            out = self._forward(b, w)
        self.c += 1
        return out.index_select(0, slots)
