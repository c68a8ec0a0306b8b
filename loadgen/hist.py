"""HDR histograms at 1 µs resolution, with a vectorised bulk insert.

Values are milliseconds in the API and microseconds inside the histogram. With 4
significant figures every value below 32.768 ms is kept exactly to the microsecond and
larger ones within 0.01 %. Recording goes through :func:`record_many` (numpy), so the
per-request cost on the load generator's hot path is a list append, not a histogram
update.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
from hdrh.histogram import HdrHistogram

LOWEST_US = 1
HIGHEST_US = 3_600_000_000  # one hour
SIGNIFICANT_FIGURES = 4
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)


# One histogram at this range and precision is a ~2.5 MB counts array that takes ~1.5-2 ms to
# allocate. A route has ~12 of them: allocated on the event loop mid-run (first flush, every
# worker report) that stalls every request in flight by ~20 ms (seen by the loop monitor).
# So they are allocated ahead of the clock (prefill) and reused (recycle).
_POOL: list[HdrHistogram] = []


def _alloc() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES)


def new_histogram() -> HdrHistogram:
    """An empty histogram (from the pool when one is there)."""
    return _POOL.pop() if _POOL else _alloc()


def prefill(n: int) -> None:
    """Allocate up to ``n`` empty histograms now (before a run's clock starts)."""
    while len(_POOL) < n:
        _POOL.append(_alloc())


def recycle(h: HdrHistogram) -> None:
    """Empty ``h`` (numpy memset, not hdrh's Python loop) and keep it for :func:`new_histogram`."""
    _counts_view(h)[:] = 0
    h.total_count = 0
    h.min_value = sys.maxsize
    h.max_value = 0
    h.start_time_stamp_msec = sys.maxsize
    h.end_time_stamp_msec = 0
    _POOL.append(h)


def _counts_view(h: HdrHistogram) -> np.ndarray:
    return np.ctypeslib.as_array(h.counts)


#: below this many values a batch goes through ``record_value`` one by one: numpy's fixed cost per
#: call (~30-90 µs: asarray, clip, unique) is more than ~2 µs a value. A flush of an interleaved run
#: is 8 configurations x ~17 metrics of 1-4 values each; the numpy path made it 5 ms (median, 16
#: records) of event loop held, the load generator's own busy lag (2026-12-03).
SMALL_BATCH = 48


def record_many(h: HdrHistogram, values_ms: Sequence[float] | np.ndarray) -> None:
    """Record many millisecond values at once (negatives count as 0, values are rounded to µs).

    Same bucket arithmetic as ``HdrHistogram.record_value`` (checked in the tests), done with
    numpy over the whole batch; a batch under :data:`SMALL_BATCH` values is recorded one by one.
    """
    if len(values_ms) == 0:
        return
    if len(values_ms) < SMALL_BATCH:
        for v in values_ms:
            h.record_value(min(max(round(float(v) * 1000.0), 0), HIGHEST_US))
        return
    us = np.rint(np.asarray(values_ms, dtype=np.float64) * 1000.0)
    us = np.clip(us, 0, HIGHEST_US).astype(np.int64)
    # bit_length(v | sub_bucket_mask): frexp's exponent equals bit_length for ints < 2**53
    ored = us | h.sub_bucket_mask
    pow2ceiling = np.frexp(ored.astype(np.float64))[1].astype(np.int64)
    bucket = pow2ceiling - h.unit_magnitude - (h.sub_bucket_half_count_magnitude + 1)
    sub = us >> (bucket + h.unit_magnitude)
    idx = ((bucket + 1) << h.sub_bucket_half_count_magnitude) + sub - h.sub_bucket_half_count
    uniq, counts = np.unique(idx, return_counts=True)
    view = _counts_view(h)
    view[uniq] += counts.astype(view.dtype)
    h.total_count += len(us)
    h.min_value = min(h.min_value, int(us.min()))
    h.max_value = max(h.max_value, int(us.max()))


def encode(h: HdrHistogram) -> str:
    """Compressed HdrHistogram encoding (base64 text), mergeable with :func:`decode_into`."""
    raw = h.encode()
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def decode(data: str) -> HdrHistogram:
    h = new_histogram()
    h.decode_and_add(data)
    return h


def decode_into(h: HdrHistogram, data: str) -> None:
    h.decode_and_add(data)


def percentiles(h: HdrHistogram, pcts: Sequence[float]) -> dict[float, int]:
    """Same answer as ``HdrHistogram.get_percentile_to_value_dict`` (the highest value
    equivalent to the bucket that holds the percentile), with numpy instead of a Python
    walk over every bucket."""
    total = h.get_total_count()
    cum = np.cumsum(_counts_view(h))
    out: dict[float, int] = {}
    for p in pcts:
        target = max(1, int(min(p, 100.0) / 100.0 * total + 0.5))
        idx = int(np.searchsorted(cum, target, side="left"))
        out[p] = h.get_highest_equivalent_value(h.get_value_from_index(idx))
    return out


def stats(h: HdrHistogram, total_ms: float | None = None) -> dict[str, float | int | None]:
    """count/min/mean/p50/p90/p95/p99/p999/max in ms (µs precision).

    ``total_ms``: the exact sum of the recorded values, for the mean (HdrHistogram's own
    mean walks every bucket in Python: seconds per histogram at this resolution).
    """
    n = h.get_total_count()
    if n == 0:
        return {"count": 0}
    pct = percentiles(h, PERCENTILES)
    out: dict[str, float | int | None] = {
        "count": n,
        "min": h.get_min_value() / 1000.0,
        "mean": round(total_ms / n, 4) if total_ms is not None else None,
    }
    for p in PERCENTILES:
        key = "p999" if p == 99.9 else f"p{int(p)}"
        out[key] = pct[p] / 1000.0
    out["max"] = h.get_max_value() / 1000.0
    return out
