"""Trace propagation, checked per hop before a run: does each hop pass the W3C ``traceparent`` on,
start its own span under it, or break the chain?

A waterfall falls apart silently when one hop of a path mishandles trace context: HAProxy
forwards the incoming ``traceparent`` unchanged (the chain holds, but the hop never appears in
it), a proxy configured to drop the header makes the server start a new trace (the chain breaks:
the server's span is a new root). This check sends ONE real request through the path with a
``traceparent`` of its own (HTTP header, or gRPC metadata) while nothing else runs on it, reads
back the spans the traced processes exported (each hop's OTLP JSON lines file, found by the
request's time window, so a hop that lost the trace is still found), and walks from the outside
in:

- a hop that exports spans (a pathprobe gateway) is ``own span`` when its SERVER span's parent is
  what the outer side sent, ``wrong parent`` when it is in the trace under another span, ``new
  root`` when it started a trace of its own, ``no span`` when it exported none;
- a hop that exports nothing (nginx, HAProxy, Caddy, LiteLLM as configured here) is judged by what
  arrived behind it: ``passes unchanged`` when the next traced span's parent is exactly what the
  outer side sent, ``new root`` when the next traced span is in another trace (the hop dropped or
  replaced the context), ``own span`` when the next span is in the trace under a span nobody here
  exported (the hop traces to somewhere else);
- the server last, the same way.

Verdicts are about what happened to the context, not judgements of the proxy: ``passes
unchanged`` is what a proxy without tracing should do, and the report says so.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pathprobe.analysis.lab.probes import probe_once
from pathprobe.analysis.report.traces import Span, read_spans

OWN_SPAN = "own span"
PASSES_UNCHANGED = "passes unchanged"
NEW_ROOT = "new root"
WRONG_PARENT = "wrong parent"
NO_SPAN = "no span"
#: verdicts under which the waterfall still holds together from the client to the server
HOLDS = (OWN_SPAN, PASSES_UNCHANGED)


@dataclass(frozen=True, slots=True)
class HopSpec:
    """One hop of a path, outermost first: its label and, when it exports spans, the file it writes."""

    label: str
    spans_file: Path | None = None


@dataclass(frozen=True, slots=True)
class HopVerdict:
    label: str
    verdict: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Propagation:
    """What one probe found, hop by hop (outermost first, the server last)."""

    trace_id: str
    hops: tuple[HopVerdict, ...] = field(default_factory=tuple)
    error: str = ""

    @property
    def holds(self) -> bool:
        """The client's trace reaches the server with every hop either in it or transparent."""
        return not self.error and all(h.verdict in HOLDS for h in self.hops)

    def as_dict(self) -> dict[str, object]:
        return {
            "trace_id": self.trace_id,
            "holds": self.holds,
            "error": self.error,
            "hops": [{"hop": h.label, "verdict": h.verdict, "detail": h.detail} for h in self.hops],
        }


def traceparent() -> tuple[str, str, str]:
    """A fresh sampled context: (header value, trace id, span id), ids in lower-case hex."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def check(
    url: str,
    hops: Sequence[HopSpec],
    server: HopSpec,
    *,
    headers: dict[str, str] | None = None,
    model: str | None = None,
    wait_s: float = 5.0,
) -> Propagation:
    """Send one request with a traceparent of our own through ``url`` and judge each hop."""
    value, trace_id, span_id = traceparent()
    start_ns = time.time_ns()
    try:
        probe_once(url, model, headers={**(headers or {}), "traceparent": value})
    except Exception as exc:  # the path does not answer: nothing to judge
        return Propagation(trace_id, error=f"probe failed: {type(exc).__name__}: {exc}")
    end_ns = time.time_ns()
    found = _collect([*hops, server], start_ns, end_ns, wait_s, trace_id)
    return Propagation(trace_id, judge(hops, server, found, trace_id, span_id))


def _collect(
    specs: Sequence[HopSpec], start_ns: int, end_ns: int, wait_s: float, trace_id: str = ""
) -> dict[str, list[Span]]:
    """Each traced hop's spans of the request (waiting for their export): those in the probe's trace,
    and those that started inside the request's window (a hop that lost the context starts a trace of
    its own)."""
    traced = [s for s in specs if s.spans_file is not None]
    deadline = time.monotonic() + wait_s
    while True:
        found = {s.label: _window(s.spans_file, start_ns, end_ns, trace_id) for s in traced if s.spans_file}
        if all(found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


#: slack on the request's window: each process turns its monotonic clock into wall time once, at start.
#: A step of the wall clock after that moves a process's spans in wall time (in one CI run the server's
#: spans came out earlier than the request that made them by more than the slack, from some moment on):
#: spans in the probe's trace are taken wherever they lie
WINDOW_SLACK_NS = 20_000_000


def _window(path: Path, start_ns: int, end_ns: int, trace_id: str = "") -> list[Span]:
    if not path.exists():
        return []
    lo, hi = start_ns - WINDOW_SLACK_NS, end_ns + WINDOW_SLACK_NS
    return [s for s in read_spans([path]) if lo <= s.start_ns <= hi or (trace_id and s.trace_id == trace_id)]


def judge(
    hops: Sequence[HopSpec], server: HopSpec, found: dict[str, list[Span]], trace_id: str, span_id: str
) -> tuple[HopVerdict, ...]:
    """Walk from the client's context inwards; ``found``: each traced hop's spans of the request."""
    verdicts: list[HopVerdict] = []
    parent = (trace_id, span_id)  # what the outer side sent to the next hop
    silent: list[str] = []  # hops that export nothing, since the last traced one
    for spec in [*hops, server]:
        if spec.spans_file is None:
            silent.append(spec.label)
            continue
        entry = _entry_span(found.get(spec.label, []), trace_id)
        if entry is None:
            verdicts += [HopVerdict(s, "unknown", "nothing traced behind it") for s in silent]
            verdicts.append(HopVerdict(spec.label, NO_SPAN, "exported no span for the request"))
            silent, parent = [], ("", "")
            continue
        verdicts += _silent_verdicts(silent, entry, parent)
        verdicts.append(_traced_verdict(spec.label, entry, parent, silent))
        silent = []
        parent = (entry.trace_id, _outgoing(found.get(spec.label, []), entry).span_id)
    return tuple(verdicts)


def _entry_span(spans: list[Span], trace_id: str) -> Span | None:
    """The hop's span for the incoming request: its SERVER span in the probe's trace, else (the
    context was lost) the latest one in the window: nothing runs on the path after the probe, while
    the slack on the window can catch a request just before it."""
    servers = sorted((s for s in spans if s.kind == "SERVER"), key=lambda s: s.start_ns)
    mine = [s for s in servers if s.trace_id == trace_id]
    return mine[0] if mine else (servers[-1] if servers else None)


def _outgoing(spans: list[Span], entry: Span) -> Span:
    """The span whose context the hop sends on: its CLIENT child (the upstream call), else the entry."""
    children = [s for s in spans if s.kind == "CLIENT" and s.parent_id == entry.span_id]
    return min(children, key=lambda s: s.start_ns) if children else entry


def _silent_verdicts(silent: list[str], entry: Span, parent: tuple[str, str]) -> list[HopVerdict]:
    """Hops that export nothing, judged by the first traced span behind them."""
    if not silent:
        return []
    if entry.trace_id != parent[0]:
        who = silent[0] if len(silent) == 1 else f"one of {', '.join(silent)}"
        return [HopVerdict(s, NEW_ROOT, f"the trace was dropped or replaced by {who}") for s in silent]
    if entry.parent_id == parent[1]:
        return [HopVerdict(s, PASSES_UNCHANGED, "forwarded the incoming traceparent as is") for s in silent]
    return [
        HopVerdict(s, OWN_SPAN, f"sent on a span of its own ({entry.parent_id}), exported elsewhere") for s in silent
    ]


def _traced_verdict(label: str, entry: Span, parent: tuple[str, str], silent: list[str]) -> HopVerdict:
    if entry.trace_id != parent[0]:
        if silent:  # the hop(s) in front of it broke the chain, not this one
            return HopVerdict(label, OWN_SPAN, "in the trace it received (a new one)")
        return HopVerdict(label, NEW_ROOT, "started a trace of its own: the incoming traceparent was not used")
    if entry.parent_id == parent[1] or silent:
        return HopVerdict(label, OWN_SPAN, "its span is a child of the context it received")
    return HopVerdict(label, WRONG_PARENT, f"in the trace, under {entry.parent_id} instead of {parent[1]}")
