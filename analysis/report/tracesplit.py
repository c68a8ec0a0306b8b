"""The segment split computed from a trace, with the same formula as in-band.

Two ways to get each hop's entries:

- ``durations``: from span timing alone. A span with attribute ``pathprobe.entry``
  counts as that entry; the server's SERVER span is ``srv.total``, the gateway's
  SERVER span is ``gw.total`` and its upstream CLIENT child ``gw.upstream``; the
  client's CLIENT span is the end-to-end time. This is the independent check.
- ``attributes`` (default): the exact values each hop recorded on its span
  (``server_timing`` on SERVER spans, ``pathprobe.e2e_ms`` / client encode/decode
  on the CLIENT span), falling back to durations for anything missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pathprobe import serverreports, timing
from pathprobe.account import account
from pathprobe.analysis.report.traces import Span, Trace
from pathprobe.segments import Split

#: span name -> entry, for spans that carry no ``pathprobe.entry`` attribute
NAME_TO_ENTRY = {
    "server.decode": "srv.decode",
    "server.encode": "srv.encode",
    "server.send": "srv.send",
    "server.body": "srv.body",
    "server.wait": "srv.wait",
    "engine.queue": "srv.queue",
    "engine.tokenize": "srv.tokenize",
    "engine.prefill": "srv.prefill",
    "engine.decode_steps": "srv.decode_steps",
    "engine.detokenize": "srv.detokenize",
    "gw.decode": "gw.decode",
    "gw.encode": "gw.encode",
    "gw.upstream": "gw.upstream",
    "gw.send": "gw.send",
    "gateway.decode": "gw.decode",
    "gateway.encode": "gw.encode",
    "gateway.upstream": "gw.upstream",
}
E2E_KEYS = ("pathprobe.e2e_ms", "pathprobe.split.e2e_ms", "e2e_ms", "pathprobe.client.e2e_ms")
#: the load generator's CLIENT span carries its in-band split; only its serialization total is
#: used (to recover the client's own encode/decode), never the other segments
CLIENT_SER_KEY = "pathprobe.split.serialization_ms"
HOP_SER = ("gw.decode", "gw.encode", "srv.decode", "srv.encode")
ENC_KEYS = ("pathprobe.client.encode_ms", "client.encode_ms", "pathprobe.client_encode_ms", "client_encode_ms")
#: the load generator's wait for its own event loop (pathprobe.loadgen.clientwait), booked as client time
WAIT_KEYS = ("pathprobe.client.wait_ms",)
DEC_KEYS = ("pathprobe.client.decode_ms", "client.decode_ms", "pathprobe.client_decode_ms", "client_decode_ms")
ROUTE_KEYS = ("pathprobe.route", "route")
TIMING_KEYS = ("server_timing", "pathprobe.server_timing", "http.response.header.server-timing")
#: the load generator's measured transport round trip to its target (TCP handshake)
ESTIMATE_KEY = "pathprobe.network_estimate_ms"


@dataclass(slots=True)
class TraceSplit:
    trace_id: str
    route: str
    split: Split | None
    entries: dict[str, float]
    e2e_source: str  # "attribute" | "client span" | "outermost server span"
    client_encode_ms: float
    client_decode_ms: float
    hops: list[str] = field(default_factory=list)
    ok: bool = True
    problem: str | None = None
    #: what a server we did not write reported in the trace (vLLM's llm_request span)
    report: serverreports.ServerReport | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "trace_id": self.trace_id,
            "route": self.route,
            "ok": self.ok,
            "problem": self.problem,
            "hops": self.hops,
            "e2e_source": self.e2e_source,
            "client_encode_ms": self.client_encode_ms,
            "client_decode_ms": self.client_decode_ms,
            "entries": self.entries,
            "split": self.split.as_dict() if self.split else None,
            "server_report": {"source": self.report.source, "entries": self.report.entries} if self.report else None,
        }


def _first(attrs: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if k in attrs and attrs[k] is not None:
            return attrs[k]
    return None


def _entry_of(span: Span) -> str | None:
    e = span.attributes.get("pathprobe.entry")
    if isinstance(e, str) and e:
        return e
    return NAME_TO_ENTRY.get(span.name)


def _is_server_hop(trace: Trace, span: Span) -> bool:
    if span.kind != "SERVER":
        return False
    st = _first(span.attributes, TIMING_KEYS)
    if isinstance(st, str) and "srv." in st and "gw." not in st:
        return True
    return any((_entry_of(c) or "").startswith("srv.") for c in trace.children.get(span.span_id, []))


def _is_gateway_hop(trace: Trace, span: Span) -> bool:
    if span.kind != "SERVER":
        return False
    if span.attributes.get("pathprobe.entry") == "gw.total":
        return True
    st = _first(span.attributes, TIMING_KEYS)
    if isinstance(st, str) and "gw." in st:
        return True
    if any((_entry_of(c) or "").startswith("gw.") for c in trace.children.get(span.span_id, [])):
        return True
    # a SERVER span that has a SERVER descendant which is the model server
    return any(_is_server_hop(trace, d) for d in trace.descendants(span))


def _gateway_entries_from_durations(trace: Trace, gw: Span) -> dict[str, float]:
    out: dict[str, float] = {"gw.total": gw.duration_ms}
    upstream: Span | None = None
    # its own spans: all but the next hop's (a SERVER span and what is under it); its work after its
    # upstream answered (a response's decode and encode, ``gw.upwait``) is among them
    for d in trace.descendants(gw, below="SERVER"):
        e = _entry_of(d)
        if e in ("gw.decode", "gw.encode", "gw.send", "gw.wait", "gw.upwait"):
            out[e] = out.get(e, 0.0) + d.duration_ms
        elif e == "gw.upstream":
            upstream = d if upstream is None else upstream
    if upstream is None:
        clients = [c for c in trace.children.get(gw.span_id, []) if c.kind == "CLIENT"]
        if clients:
            upstream = clients[0]
    if upstream is not None:
        # a stream's upstream call may be split in several spans: take the first's start to the last's end
        out["gw.upstream"] = upstream.duration_ms
    for c in trace.children.get(gw.span_id, []):  # transcode work named *decode / *encode
        if c.span_id == (upstream.span_id if upstream else None) or _entry_of(c):
            continue
        if c.name.endswith("decode"):
            out["gw.decode"] = out.get("gw.decode", 0.0) + c.duration_ms
        elif c.name.endswith("encode"):
            out["gw.encode"] = out.get("gw.encode", 0.0) + c.duration_ms
    return out


def _server_entries_from_durations(trace: Trace, srv: Span) -> dict[str, float]:
    out: dict[str, float] = {"srv.total": srv.duration_ms}
    for c in trace.descendants(srv):
        e = _entry_of(c)
        if e and e.startswith("srv.") and e != "srv.total":
            out[e] = out.get(e, 0.0) + c.duration_ms
    return out


def _hops_serialization(entries: dict[str, float]) -> float:
    """Every hop's decode + encode (each gateway of a chain counted, not only the last)."""
    if isinstance(entries, timing.Chain) and entries.hops:
        return sum(h.get("decode") + h.get("encode") for h in entries.hops)
    return sum(entries.get(k, 0.0) for k in HOP_SER)


def split_trace(trace: Trace, source: str = "attributes") -> TraceSplit:
    """Split one trace. ``source``: ``attributes`` (exact, default) or ``durations``."""
    use_attrs = source == "attributes"
    srv, path_gws, client, problem = _hop_spans(trace)
    entries = _chain_entries(trace, srv, path_gws, client, use_attrs)
    hops = [f"gateway:{g.service or g.name}" for g in path_gws]
    if srv is not None:
        hops.append(f"server:{srv.service or srv.name}")
    if client is not None:
        hops.insert(0, f"client:{client.service or client.name}")
        route, enc, dec, e2e, e2e_source = _client_side(client, entries, use_attrs)
    else:
        outer = path_gws[0] if path_gws else srv
        if outer is None:
            why = "no client, gateway or server span in this trace"
            return TraceSplit(trace.trace_id, "", None, entries, "none", 0.0, 0.0, hops, False, why)
        route, enc, dec = outer.name, 0.0, 0.0
        e2e, e2e_source = outer.duration_ms, "outermost server span"
        problem = problem or "no client span: network hop 1 is not measured (e2e = outermost server span)"
    report = None
    if srv is None:
        report, why = _engine_report(trace, hops)
        problem = problem or why
    ok = True
    if client is not None:
        status = client.status.get("code") if client.status else None
        ok = status not in (2, "STATUS_CODE_ERROR")
    sp = None if math.isnan(e2e) else _account(e2e, entries, report, client, enc, dec)
    return TraceSplit(trace.trace_id, route, sp, entries, e2e_source, enc, dec, hops, ok, problem, report)


def _hop_spans(trace: Trace) -> tuple[Span | None, list[Span], Span | None, str | None]:
    """(the server span, the gateways on its path outermost first, the client span, a problem)."""
    servers = [s for s in trace.spans if _is_server_hop(trace, s)]
    gateways = [s for s in trace.spans if s not in servers and _is_gateway_hop(trace, s)]
    clients = [
        s
        for s in trace.spans
        if s.kind == "CLIENT" and not any(a.kind in ("SERVER", "CLIENT") for a in trace.ancestors(s))
    ]
    problem = f"{len(servers)} server spans in one trace (retries?); the first is used" if len(servers) > 1 else None
    srv = servers[0] if servers else None
    # every gateway on the server span's path (a chain), outermost first; else the outermost one
    path_gws: list[Span] = []
    if gateways:
        anc = {a.span_id for a in trace.ancestors(srv)} if srv else set()
        path_gws = [g for g in gateways if g.span_id in anc] or gateways[:1]  # sorted by start: outermost first
    return srv, path_gws, clients[0] if clients else None, problem


def _chain_entries(
    trace: Trace, srv: Span | None, path_gws: list[Span], client: Span | None, use_attrs: bool
) -> dict[str, float]:
    """The chain of hops' entries: one hop per span, innermost (the server) first, as the hops
    appended them; what the client received, when it kept it, wins (every hop apart)."""
    chain_hops: list[timing.Hop] = []
    for hop in ([srv] if srv is not None else []) + path_gws[::-1]:
        own = _server_entries_from_durations(trace, hop) if hop is srv else _gateway_entries_from_durations(trace, hop)
        if use_attrs:
            st = _first(hop.attributes, TIMING_KEYS)
            if isinstance(st, str):
                sent = timing.parse_chain(st)  # what this hop sent: its upstream's hops, then its own
                if sent.hops and sent.hops[-1].kind == (timing.SERVER_KIND if hop is srv else timing.GATEWAY_KIND):
                    own.update(sent.hops[-1].entries)
        chain_hops.append(timing.Hop(timing.SERVER_KIND if hop is srv else timing.GATEWAY_KIND, own))
    entries: dict[str, float] = timing.Chain(chain_hops)
    if use_attrs and client is not None:
        st = _first(client.attributes, TIMING_KEYS)
        if isinstance(st, str):
            received = timing.parse_chain(st)
            entries = timing.Chain((*received.hops,)) if received.hops else entries
    return entries


def _client_side(client: Span, entries: dict[str, float], use_attrs: bool) -> tuple[str, float, float, float, str]:
    """(route, client encode, client decode, e2e, where e2e came from) of the client's span."""
    attrs = client.attributes
    route = str(_first(attrs, ROUTE_KEYS) or client.name)
    enc = float(_first(attrs, ENC_KEYS) or 0.0)
    dec = float(_first(attrs, DEC_KEYS) or 0.0)
    if use_attrs and _first(attrs, ENC_KEYS) is None and _first(attrs, DEC_KEYS) is None and CLIENT_SER_KEY in attrs:
        # client encode + decode = the client's serialization total minus the hops' own
        enc = max(0.0, float(attrs[CLIENT_SER_KEY]) - _hops_serialization(entries))
    e2e_attr = _first(attrs, E2E_KEYS)
    if use_attrs and e2e_attr is not None:
        return route, enc, dec, float(e2e_attr), "attribute"
    return route, enc, dec, client.duration_ms, "client span"


def _engine_report(trace: Trace, hops: list[str]) -> tuple[serverreports.ServerReport | None, str]:
    """No server span: the engine's own report (vLLM's llm_request span), if any, and the problem."""
    engine = next((s for s in trace.spans if s.name == serverreports.VLLM_SPAN), None)
    report = serverreports.from_vllm_span(engine.attributes) if engine is not None else None
    if report is None or engine is None:
        return None, "no server span (a server that exports no traces?): its time is unsplit"
    hops.append(f"engine:{engine.service or engine.name}")
    return (
        report,
        "the server reports its engine's phases only (vLLM's llm_request span): the rest of its time is unsplit",
    )


def _account(
    e2e: float,
    entries: dict[str, float],
    report: serverreports.ServerReport | None,
    client: Span | None,
    enc: float,
    dec: float,
) -> Split:
    """The one accounting entry point, with what the client's span says of its estimate and wait."""
    client_est = _first(client.attributes, (ESTIMATE_KEY,)) if client is not None else None
    # the load generator's own wait, as it booked it (never more than the client's link took)
    wait = float(_first(client.attributes, WAIT_KEYS) or 0.0) if client is not None else 0.0
    return account(
        e2e,
        entries,
        report,
        client_encode_ms=enc,
        client_decode_ms=dec,
        client_estimate_ms=float(client_est) if client_est is not None else None,
        client_wait_ms=wait,
    ).split
