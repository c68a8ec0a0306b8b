"""One request as a waterfall: client -> hop(s) -> server -> engine phases, from its record.

Only durations are measured (no timestamp crosses a process), so each component is drawn
inside the one that called it with its link time split evenly before and after it, and a
server's phases in the order its pipeline runs them. The durations are the record's; the
layout inside a component is the one choice made here. A part inside a component that
reports nothing is a bar of its own, marked unsplit; phases that component's engine reported
(vLLM) are drawn inside it, centred, since where they fell within it is not reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pathprobe.records import HopPartRecord

#: a reporting server's phases in pipeline order (detokenizing runs alongside the decode steps)
SERVER_PHASES = (
    ("srv.decode", "serialization"),
    ("srv.tokenize", "inference"),
    ("srv.queue", "queueing"),
    ("srv.prefill", "inference"),
    ("srv.decode_steps", "inference"),
    ("srv.inference", "inference"),
    ("srv.detokenize", "inference"),
    ("srv.encode", "serialization"),
)
ENGINE_PHASES = (("srv.queue", "queueing"), ("srv.prefill", "inference"), ("srv.decode_steps", "inference"))


@dataclass(frozen=True, slots=True)
class Bar:
    row: str  # the component (a row of the plot)
    start: float  # ms from the client's send
    dur: float
    part: str  # a segment name, or "span" for a component's whole time
    label: str = ""

    @property
    def end(self) -> float:
        return self.start + self.dur


def _phases(row: str, start: float, entries: Mapping[str, float], order: Sequence[tuple[str, str]]) -> list[Bar]:
    out: list[Bar] = []
    t = start
    for name, part in order:
        d = entries.get(name)
        if d:
            out.append(Bar(row, t, d, part, name.split(".", 1)[1]))
            t += d
    return out


def bars(rec: Mapping[str, Any]) -> list[Bar]:
    """The waterfall of one OK record (with its ``split``), outermost component first."""
    sp = rec["split"]
    e2e, enc, dec = rec["e2e_ms"], rec.get("client_encode_ms", 0.0), rec.get("client_decode_ms", 0.0)
    out = [Bar("client", 0.0, e2e, "span", "e2e")]
    if enc:
        out.append(Bar("client", 0.0, enc, "serialization", "encode"))
    if dec:
        out.append(Bar("client", e2e - dec, dec, "serialization", "decode"))
    lo, span = enc, e2e - enc - dec  # what the client saw its upstream take
    links: list[float] = list(sp.get("links") or [])
    hops: list[HopPartRecord] = list(sp.get("hops") or [])
    entries = dict(rec.get("entries") or {})
    for i, hop in enumerate(hops):
        link = links[i] if i < len(links) else 0.0
        # a streaming hop's waits on its transport (<kind>.send) are its link's time but lie inside
        # its total: the bar keeps its measured width, inside what its caller saw it take
        start = lo + max(min(link, span - hop["total"]), 0.0) / 2
        row = str(hop["label"])
        out.append(Bar(row, start, hop["total"], "span", row))
        server = row.split(" ", 1)[0] == "srv" and i == len(hops) - 1
        if server:
            own = {**entries, **((rec.get("server_report") or {}).get("entries") or {})}
            out += _phases(row, start, own, SERVER_PHASES)
            return out
        upstream = hop["total"] - hop["serialization"] - hop["other"]
        lo, span = start + (hop["total"] - upstream) / 2, upstream
    # the innermost link ends in a component that reports nothing: network (measured or
    # estimated) and its unsplit time
    net = links[len(hops)] if len(links) > len(hops) else 0.0
    start = lo + max(net, 0.0) / 2
    width = max(span - max(net, 0.0), 0.0)
    label = "server (unsplit)" if not hops else "upstream (unsplit)"
    out.append(Bar(label, start, width, "unsplit", "reports nothing"))
    rep = rec.get("server_report")
    if rep:
        phases = [(n, p) for n, p in ENGINE_PHASES if rep["entries"].get(n)]
        known = sum(rep["entries"][n] for n, _ in phases)
        out += _phases(f"engine ({rep['source']})", start + max(width - known, 0.0) / 2, rep["entries"], phases)
    return out


def representative(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The OK record with the median end-to-end time (a typical request, not a cherry-picked one)."""
    ok = sorted((r for r in records if r.get("ok") and r.get("split")), key=lambda r: r["e2e_ms"])
    return ok[len(ok) // 2] if ok else None
