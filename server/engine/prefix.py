"""Prefix caching for the transformers engine: the KV of finished requests, kept so that a later
prompt that starts with the same tokens (a conversation's earlier turns, a shared system prompt)
prefills only what is new.

The KV at position ``i`` depends only on tokens ``0..i`` (causal attention, absolute positions
from 0), so the first ``L`` positions of any cached sequence serve any prompt that shares its first
``L`` tokens: the reuse is exact, not an approximation. An entry holds one sequence's per-layer
keys and values (``[1, heads, n, head_dim]``, compact copies) and its token ids; a lookup takes the
longest common prefix over all entries. Memory is bounded by bytes and by entries, least recently
used first out.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from pathprobe.engineoptions import PREFIX_CACHE_ENTRIES, PREFIX_CACHE_MB
from pathprobe.errors import ConfigError
from pathprobe.server.engine.torchtypes import Array, Tensor

#: shorter matches are not worth a prefill of their own (a hit prefills alone, not batched)
MIN_MATCH_TOKENS = 16
#: default bounds: 512 MiB of KV (the Llama-3-8B shape keeps 128 KiB a token: ~4k tokens), 64 entries
DEFAULT_MB = PREFIX_CACHE_MB  # the option's one default
DEFAULT_ENTRIES = PREFIX_CACHE_ENTRIES


@dataclass(frozen=True, slots=True)
class PrefixCacheOptions:
    """``--engine-option prefix_cache=1|0``, ``prefix_cache_mb=N``, ``prefix_cache_entries=N``."""

    enabled: bool = True
    max_mb: float = DEFAULT_MB
    max_entries: int = DEFAULT_ENTRIES

    @classmethod
    def parse(cls, enabled: bool, max_mb: float | str, max_entries: int | str) -> PrefixCacheOptions:
        """From the engine's option values (``--engine-option`` strings or numbers)."""
        try:
            out = cls(enabled=enabled, max_mb=float(max_mb), max_entries=int(max_entries))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"--engine-option prefix_cache_mb / prefix_cache_entries: {exc}") from None
        if out.max_mb <= 0 or out.max_entries < 1:
            raise ConfigError("--engine-option prefix_cache_mb must be > 0 and prefix_cache_entries >= 1")
        return out


@dataclass(slots=True)
class Hit:
    """A lookup's answer: the first ``tokens`` positions of ``kv`` are the prompt's."""

    tokens: int
    kv: list[tuple[Tensor, Tensor]]


@dataclass(slots=True)
class _Entry:
    ids: Array  # numpy int64 array: the tokens whose KV is held
    kv: list[tuple[Tensor, Tensor]]  # per layer (keys, values), [1, heads, n, head_dim]
    nbytes: int


class PrefixCache:
    """Token-prefix -> KV store, LRU by bytes and entries. Used from the engine's worker thread only."""

    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
        self._next = 0
        self.bytes = 0
        self.stats = {"hits": 0, "misses": 0, "stored": 0, "evicted": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: list[int]) -> Hit | None:
        """The longest cached prefix of ``ids`` (at most ``len(ids) - 1`` tokens: the last prompt
        token is always computed, its logits give the first output token)."""
        import numpy as np

        want = np.asarray(ids, dtype=np.int64)
        limit = len(want) - 1
        best, best_key = 0, -1
        for key, e in self._entries.items():
            n = min(limit, len(e.ids))
            if n <= best:
                continue
            diff = np.flatnonzero(want[:n] != e.ids[:n])
            common = int(diff[0]) if diff.size else n
            if common > best:
                best, best_key = common, key
        if best < MIN_MATCH_TOKENS:
            self.stats["misses"] += 1
            return None
        self._entries.move_to_end(best_key)
        self.stats["hits"] += 1
        return Hit(best, self._entries[best_key].kv)

    def store(self, ids: list[int], kv: list[tuple[Tensor, Tensor]]) -> bool:
        """Keep ``kv`` (compact tensors the caller no longer changes) for ``ids``; False when an entry
        already covers ``ids`` or it alone exceeds the byte bound."""
        import numpy as np

        if len(ids) < MIN_MATCH_TOKENS:
            return False
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if nbytes > self.max_bytes:
            return False
        new = np.asarray(ids, dtype=np.int64)
        for key, e in list(self._entries.items()):
            n = len(new)
            if len(e.ids) >= n and np.array_equal(e.ids[:n], new):
                self._entries.move_to_end(key)  # already held (as this or a longer sequence)
                return False
            if len(e.ids) < n and np.array_equal(new[: len(e.ids)], e.ids):
                self._drop(key)  # the new one extends it: it serves every prompt the old one did
        self._entries[self._next] = _Entry(new, kv, nbytes)
        self._next += 1
        self.bytes += nbytes
        self.stats["stored"] += 1
        while self.bytes > self.max_bytes or len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))
            self.stats["evicted"] += 1
        return True

    def _drop(self, key: int) -> None:
        self.bytes -= self._entries.pop(key).nbytes
