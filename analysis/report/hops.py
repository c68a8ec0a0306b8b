"""Hop by hop: the network of every link and the own time of every reporting hop of a path.

Each record's split carries ``links`` (network per link, outermost first) and ``hops`` (each
reporting hop's total, serialization and other, outermost first). A path's requests
normally share one shape (the same hops); the summary is taken over the requests of the
most common shape and says how many that is (a stream through a proxy that reports only
unary calls has a shorter chain than the unary calls of the same run).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pathprobe.analysis.report.model import HopPath
from pathprobe.records import SplitRecord

Record = Mapping[str, Any]
#: a link whose network is an estimate (a round trip measured apart), as in the tables
ESTIMATED = "est."


def _shape(rec: Record) -> tuple[tuple[str, ...], int] | None:
    sp = rec.get("split") or {}
    hops, links = sp.get("hops"), sp.get("links")
    if hops is None or links is None:
        return None
    return tuple(h["label"] for h in hops), len(links)


def _link_estimated(split: SplitRecord, j: int) -> bool:
    flags = split.get("links_estimated")
    if flags is None:  # a record from before per-link flags: the estimate was always the innermost link's
        return bool(split.get("network_estimated")) and j == len(split.get("links") or ()) - 1
    return j < len(flags) and bool(flags[j])


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _p50(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def summarize_hops(records: Sequence[Record], names: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Per link: mean and median network; per reporting hop: mean total, serialization and
    own time (other). ``names``: display names of the hops outermost first (e.g. from the
    compare config), used when they match the number of hops reported."""
    ok = [r for r in records if r.get("ok")]
    shapes = Counter(s for r in ok if (s := _shape(r)) is not None)
    if not shapes:
        return None
    shape, count = shapes.most_common(1)[0]
    labels, n_links = shape
    recs = [r for r in ok if _shape(r) == shape]
    shown = (
        list(names)
        if names is not None and len(names) == len(labels)
        else ["server" if label == "srv" else label for label in labels]
    )
    hops = []
    for i, label in enumerate(shown):
        parts = [r["split"]["hops"][i] for r in recs]
        hops.append(
            {
                "label": label,
                "reported_as": labels[i],
                "total_mean_ms": _mean([p["total"] for p in parts]),
                "serialization_mean_ms": _mean([p["serialization"] for p in parts]),
                "own_mean_ms": _mean([p["other"] for p in parts]),
            }
        )
    links = []
    for j in range(n_links):
        outer = "client" if j == 0 else shown[j - 1]
        inner = shown[j] if j < len(shown) else "(reports nothing)"
        vals = [r["split"]["links"][j] for r in recs]
        est = sum(1 for r in recs if _link_estimated(r["split"], j))
        #: estimated: how many of these requests had this link's network estimated (not measured)
        links.append({"label": f"{outer} → {inner}", "mean_ms": _mean(vals), "p50_ms": _p50(vals), "estimated": est})
    return {
        "n": count,
        "of": len(ok),
        "hops": hops,
        "links": links,
        "other_shapes": len(shapes) - 1,
        "unsplit_mean_ms": _mean([float(r["split"].get("unsplit") or 0.0) for r in recs]),
    }


def format_path(summary: HopPath) -> str:
    """``client ─1.10─▶ gw (http-proxy) [own 0.32, ser 0.00] ─0.25 est.─▶ ...`` (means, ms; est.: that
    link's network is an estimate)."""
    parts = []
    for j, link in enumerate(summary.links):
        est = f" {ESTIMATED}" if link.estimated else ""
        parts.append(f"─{link.mean_ms or 0.0:.3f}{est}─▶")
        if j < len(summary.hops):
            h = summary.hops[j]
            parts.append(f"{h.label} [own {h.own_mean_ms or 0.0:.3f}, ser {h.serialization_mean_ms or 0.0:.3f}]")
        else:
            parts.append(f"(reports nothing: unsplit {summary.unsplit_mean_ms or 0.0:.3f})")
    text = "client " + " ".join(parts)
    if summary.n < summary.of:
        text += f" ({summary.n} of {summary.of} requests have this shape)"
    return text
