"""Per-request records written by ``pathprobe load`` (``records.jsonl``, one
:class:`pathprobe.records.RequestRecord` per line), and the agreement check between
trace-based and in-band splits."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pathprobe import jsonl
from pathprobe.records import SPLIT_SEGMENTS, RequestRecord

#: the split's segments compared between a trace and a record
SPLIT_KEYS = SPLIT_SEGMENTS


def read_records(path: str | os.PathLike[str]) -> list[RequestRecord]:
    """Every record of a ``records.jsonl`` file (as written; not validated key by key)."""
    return [obj for _, obj in jsonl.read(path, "records")]


class TaggedRecord(RequestRecord, total=False):
    """A record with the analysis' own tags (no part of the record's schema; never written back)."""

    _round: int  # the round of the run it came from
    _concurrency: int  # the run's concurrency


def read_tagged(path: str | os.PathLike[str], *, _round: int, _concurrency: int) -> list[TaggedRecord]:
    """The records of a file, each tagged with its run's round and concurrency."""
    tagged: list[TaggedRecord] = [{**rec, "_round": _round, "_concurrency": _concurrency} for rec in read_records(path)]
    return tagged


def ok_records(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.get("ok") and r.get("split")]


def within(a: float, b: float, rel: float = 0.05, abs_ms: float = 0.2) -> bool:
    """The agreement rule: equal within 5% (of the in-band value) or 0.2 ms."""
    return abs(a - b) <= max(rel * abs(b), abs_ms)


#: what a trace cannot split on a path with a hop that exports no spans (it reports in-band only):
#: that hop's two links and its own time are one stretch of network in the trace
UNSEEN_HOP_SEGMENTS = ("network", "other")
UNSEEN_HOP_SKIPPED = ("network_hop1", "network_hop2")


def _together(split: Mapping[str, object], together: Sequence[str]) -> dict[str, object]:
    """A split with the ``together`` segments summed under one key ("network+other")."""
    out = {k: v for k, v in split.items() if k not in together}
    parts = [float(v) for k in together if isinstance(v := split.get(k), int | float)]
    out["+".join(together)] = sum(parts) if len(parts) == len(together) else None
    return out


def agreement(
    trace_splits: Sequence[Any],
    records: Sequence[Mapping[str, Any]],
    *,
    rel: float = 0.05,
    abs_ms: float = 0.2,
    together: Sequence[str] = (),
    skipped: Sequence[str] = (),
) -> dict[str, Any]:
    """Match trace splits to records by trace id; per segment, how far apart they are.

    ``together``: segments compared as their sum only (a hop the trace cannot see moves time between
    them); ``skipped``: segments the trace cannot make at all (not compared, listed as such)."""
    by_id = {r["trace_id"]: r for r in records if r.get("trace_id") and r.get("split")}
    keys = [k for k in ("e2e", *SPLIT_KEYS) if k not in together and k not in skipped]
    if together:
        keys.append("+".join(together))
    per: dict[str, dict[str, Any]] = {
        k: {"n": 0, "outside": 0, "max_abs_diff_ms": 0.0, "worst_trace": None} for k in keys
    }
    matched = 0
    for ts in trace_splits:
        rec = by_id.get(ts.trace_id)
        if rec is None or ts.split is None:
            continue
        matched += 1
        mine = ts.split.as_dict()
        theirs: Mapping[str, Any] = rec["split"] or {}
        if together:
            mine, theirs = _together(mine, together), _together(theirs, together)
        for key, st in per.items():
            a, b = mine.get(key), theirs.get(key)
            if a is None or b is None:
                continue
            st["n"] += 1
            d = abs(a - b)
            if d > st["max_abs_diff_ms"]:
                st["max_abs_diff_ms"], st["worst_trace"] = d, ts.trace_id
            if not within(a, b, rel, abs_ms):
                st["outside"] += 1
    return {
        "rule": f"|trace - in-band| <= max({rel:.0%} of in-band, {abs_ms} ms)",
        "traces": len(trace_splits),
        "records_with_trace": len(by_id),
        "matched": matched,
        "segments": per,
        "together": list(together),
        "skipped": list(skipped),
        "agree": matched > 0 and all(st["outside"] == 0 for st in per.values()),
    }
