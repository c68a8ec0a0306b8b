"""Per-chunk timing of streams: the server's emit offsets against the client's arrival offsets.

The server stamps each streamed chunk with ``emit_ms`` (ms since it received the request, its
monotonic clock); the client records when each chunk arrived (ms since it sent the request,
its clock). The two origins differ by a constant (the request's way in), so per chunk
``arrival - emit`` is the chunk's delay up to that constant, and per gap between two chunks:

- **decode gap** = emit gap: the time the server (engine and front end) took between them;
- **transport gap** = arrival gap - emit gap: what the path added to (or took from) that gap.

A proxy that **buffers or coalesces** chunks delivers several that were emitted apart at
(nearly) the same instant: a gap the server made (emit gap >= :data:`MIN_EMIT_GAP_MS`) that
arrives at less than :data:`COALESCED_RATIO` of its size is *coalesced*. A busy load generator
does the same on its side (chunks pile up while its event loop runs other work), so a stream is
*buffered* only when at least half of its eligible gaps (at least :data:`MIN_GAPS`) are coalesced
AND its chunks were held back systematically on the path: the first chunk's delay exceeds the
last one's by at least half the stream's emit span, beyond what the client's own waits during
the stream (``client_wait_total_ms``) explain. A configuration is named as buffering when at
least half of its streams are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate, pairwise
from typing import Any, TypedDict

MIN_EMIT_GAP_MS = 0.5
COALESCED_RATIO = 0.25
MIN_GAPS = 3
BUFFERING_SHARE = 0.5


class ChunkTiming(TypedDict):
    """One stream's chunk timing (ms)."""

    decode_gaps: list[float]
    transport_gaps: list[float]
    delay_spread_ms: float
    eligible_gaps: int
    coalesced_gaps: int
    held_back_ms: float
    buffered: bool


class ChunkSummary(TypedDict):
    """One configuration's chunk timing (ms): the report's ``chunks``."""

    streams: int
    decode_gap_p50_ms: float | None
    transport_gap_p50_ms: float | None
    transport_gap_p99_ms: float | None
    delay_spread_p50_ms: float
    buffered_streams: int
    buffered_share: float
    buffering: bool


def chunk_timing(rec: Mapping[str, Any]) -> ChunkTiming | None:
    """Decode and transport gaps, per-chunk delay spread, coalesced gaps of one stream record."""
    emit = rec.get("emit_ms")
    if not emit or rec.get("ttft_ms") is None:
        return None
    arrival = list(accumulate([float(rec["ttft_ms"]), *map(float, rec.get("itl_ms") or ())]))
    if len(arrival) != len(emit):
        return None
    dec = [b - a for a, b in pairwise(emit)]
    arr = [b - a for a, b in pairwise(arrival)]
    transport = [a - d for a, d in zip(arr, dec)]
    delay = [a - e for a, e in zip(arrival, emit)]
    eligible = [(a, d) for a, d in zip(arr, dec) if d >= MIN_EMIT_GAP_MS]
    coalesced = sum(1 for a, d in eligible if a < COALESCED_RATIO * d)
    held = delay[0] - delay[-1] - float(rec.get("client_wait_total_ms") or 0.0)
    span = emit[-1] - emit[0]
    return {
        "decode_gaps": dec,
        "transport_gaps": transport,
        "delay_spread_ms": max(delay) - min(delay),
        "eligible_gaps": len(eligible),
        "coalesced_gaps": coalesced,
        "held_back_ms": held,
        "buffered": len(eligible) >= MIN_GAPS and coalesced >= 0.5 * len(eligible) and held >= 0.5 * span,
    }


def summarize(records: Sequence[Mapping[str, Any]]) -> ChunkSummary | None:
    """Per configuration: median decode and transport gap, median per-stream delay spread, the share of
    buffered streams and whether the path buffers (None when no stream carried emit offsets)."""
    import numpy as np

    per = [c for c in (chunk_timing(r) for r in records if r.get("ok")) if c is not None]
    if not per:
        return None
    dec = [g for c in per for g in c["decode_gaps"]]
    tra = [g for c in per for g in c["transport_gaps"]]
    buffered = sum(1 for c in per if c["buffered"])
    share = buffered / len(per)
    return {
        "streams": len(per),
        "decode_gap_p50_ms": float(np.median(dec)) if dec else None,
        "transport_gap_p50_ms": float(np.median(tra)) if tra else None,
        "transport_gap_p99_ms": float(np.percentile(tra, 99)) if tra else None,
        "delay_spread_p50_ms": float(np.median([c["delay_spread_ms"] for c in per])),
        "buffered_streams": buffered,
        "buffered_share": share,
        "buffering": share >= BUFFERING_SHARE,
    }
