"""Per-request records and their exact aggregation (per route, per metric).

A record is a :class:`pathprobe.records.RequestRecord` (the JSONL schema, defined there).
:class:`Aggregator` keeps request/ok/error counts and one HDR histogram per route and
metric. Records are appended to a pending batch on the hot path; :meth:`Aggregator.flush`
moves the batch into the histograms (vectorised) and hands it to a sink (JSONL file or
the master). Histogram deltas can be shipped as encoded text and merged exactly. The files
a run writes from them are :mod:`pathprobe.loadgen.outputs`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NotRequired

from hdrh.histogram import HdrHistogram
from pathprobe.loadgen import hist
from pathprobe.loadgen.turns import TurnSummary, TurnTable, TurnWire
from pathprobe.records import SPLIT_SEGMENTS, RequestRecord
from typing_extensions import TypedDict

#: the split's segments, one histogram each
SEGMENT_METRICS = SPLIT_SEGMENTS
#: every metric a summary can hold, in table order
METRICS = (
    "e2e",
    "latency",
    *SEGMENT_METRICS,
    "client_encode",
    "client_decode",
    "schedule_lag",
    "client_wait",
    "ttft",
    "itl",
    "tpot",
)

Record = RequestRecord
#: a request still in flight when the test stopped: recorded, counted apart from errors
STOPPED = "STOPPED"


class RouteWire(TypedDict):
    """One route's counts and histograms (encoded) as a worker ships them and histograms.json holds them."""

    requests: int
    ok: int
    errors_by_status: dict[str, int]
    first_ts: float | None
    last_ts: float | None
    hists: dict[str, str]
    sums: dict[str, float]
    estimated: int
    estimate_kinds: dict[str, int]
    links_estimated: list[int]
    turns: NotRequired[dict[str, TurnWire]]  # --sessions: each turn's raw figures (pathprobe.loadgen.turns)


class Totals(TypedDict):
    requests: int
    ok: int
    errors: int
    stopped: int
    errors_by_status: dict[str, int]


class RouteSummary(Totals):
    """One route in summary.json: its counts and every metric's statistics (ms)."""

    rps: float | None
    network_estimated: int
    network_estimate_kind: dict[str, int]
    links_estimated: list[int]
    metrics: dict[str, dict[str, float | int | None]]
    #: --sessions: per turn, TTFT, prompt tokens and the server's cached share (pathprobe.loadgen.turns)
    turns: NotRequired[list[TurnSummary]]


class Summary(TypedDict):
    """summary.json without its ``client`` block (:func:`pathprobe.loadgen.outputs.write_outputs` adds it)."""

    meta: Mapping[str, object]
    totals: Totals
    routes: dict[str, RouteSummary]


class RouteAgg:
    __slots__ = (
        "errors_by_status",
        "estimate_kinds",
        "estimated",
        "first_ts",
        "hists",
        "last_ts",
        "links_estimated",
        "ok",
        "requests",
        "sums",
        "turns",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.ok = 0
        self.errors_by_status: dict[str, int] = {}
        self.hists: dict[str, HdrHistogram] = {}
        self.sums: dict[str, float] = {}  # exact sums (ms) for the means
        self.first_ts: float | None = None
        self.last_ts: float | None = None
        self.estimated = 0  # OK records whose network is (partly) an estimate: a round trip measured apart
        self.estimate_kinds: dict[str, int] = {}  # those records by estimate kind (pathprobe.rtt)
        self.links_estimated: list[int] = []  # per link, outermost first: records whose link is estimated
        self.turns = TurnTable()  # --sessions: figures per turn of a conversation

    def hist(self, metric: str) -> HdrHistogram:
        h = self.hists.get(metric)
        if h is None:
            h = self.hists[metric] = hist.new_histogram()
        return h

    def _ts(self, first: float | None, last: float | None) -> None:
        if first is not None and (self.first_ts is None or first < self.first_ts):
            self.first_ts = first
        if last is not None and (self.last_ts is None or last > self.last_ts):
            self.last_ts = last

    def add_records(self, recs: list[Record]) -> None:
        oks: list[Record] = []
        for rec in recs:
            if rec["ok"]:
                oks.append(rec)
            else:
                st = str(rec.get("status"))
                self.errors_by_status[st] = self.errors_by_status.get(st, 0) + 1
        self.requests += len(recs)
        self.ok += len(oks)
        tss = [r["ts"] for r in recs if r.get("ts") is not None]
        if tss:
            ends = [r["ts"] + r["e2e_ms"] / 1000.0 for r in recs if r.get("ts") is not None]
            self._ts(min(tss), max(ends))
        if not oks:
            return
        # one list per metric, built with comprehensions (cheaper than a per-record generator)
        values: dict[str, list[float]] = {
            "e2e": [r["e2e_ms"] for r in oks],
            "latency": [r["latency_ms"] for r in oks],
            "client_encode": [r["client_encode_ms"] for r in oks],
            "client_decode": [r["client_decode_ms"] for r in oks],
            "schedule_lag": [r["schedule_lag_ms"] for r in oks],
            "client_wait": [r.get("client_wait_ms", 0.0) for r in oks],
        }
        splits: list[Mapping[str, Any]] = [sp for r in oks if (sp := r.get("split"))]
        est = [(r, sp) for r in oks if (sp := r.get("split")) and sp.get("network_estimated")]
        self.estimated += len(est)
        for r, sp in est:
            kind = str(r.get("network_estimate_kind") or "unnamed")
            self.estimate_kinds[kind] = self.estimate_kinds.get(kind, 0) + 1
            self._add_links([int(bool(x)) for x in sp.get("links_estimated") or ()])
        if splits:
            for name in SEGMENT_METRICS:
                values[name] = [sp[name] for sp in splits]
        ttft = [t for r in oks if (t := r.get("ttft_ms")) is not None]
        if ttft:
            values["ttft"] = ttft
        tpot = [t for r in oks if (t := r.get("tpot_ms")) is not None]
        if tpot:
            values["tpot"] = tpot
        itl = [g for r in oks for g in (r.get("itl_ms") or ())]
        if itl:
            values["itl"] = itl
        for name, lst in values.items():
            hist.record_many(self.hist(name), lst)
            self.sums[name] = self.sums.get(name, 0.0) + sum(lst)
        self.turns.add_records(oks)

    def _add_links(self, counts: list[int]) -> None:
        if len(counts) > len(self.links_estimated):
            self.links_estimated += [0] * (len(counts) - len(self.links_estimated))
        for j, n in enumerate(counts):
            self.links_estimated[j] += n

    def _add_kinds(self, kinds: dict[str, int]) -> None:
        for k, n in kinds.items():
            self.estimate_kinds[k] = self.estimate_kinds.get(k, 0) + n

    def to_wire(self) -> RouteWire:
        wire: RouteWire = {
            "requests": self.requests,
            "ok": self.ok,
            "errors_by_status": dict(self.errors_by_status),
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "hists": {m: hist.encode(h) for m, h in self.hists.items() if h.get_total_count()},
            "sums": dict(self.sums),
            "estimated": self.estimated,
            "estimate_kinds": dict(self.estimate_kinds),
            "links_estimated": list(self.links_estimated),
        }
        if self.turns:
            wire["turns"] = self.turns.to_wire()
        return wire

    def merge_wire(self, data: RouteWire) -> None:
        self.requests += data["requests"]
        self.ok += data["ok"]
        for st, n in data["errors_by_status"].items():
            self.errors_by_status[st] = self.errors_by_status.get(st, 0) + n
        self._ts(data.get("first_ts"), data.get("last_ts"))
        for m, enc in data["hists"].items():
            hist.decode_into(self.hist(m), enc)
        for m, v in data.get("sums", {}).items():
            self.sums[m] = self.sums.get(m, 0.0) + v
        self.estimated += data.get("estimated", 0)
        self._add_kinds(data.get("estimate_kinds") or {})
        self._add_links(list(data.get("links_estimated") or ()))
        self.turns.merge_wire(data.get("turns") or {})

    def merge(self, other: RouteAgg) -> None:
        self.requests += other.requests
        self.ok += other.ok
        for st, n in other.errors_by_status.items():
            self.errors_by_status[st] = self.errors_by_status.get(st, 0) + n
        self._ts(other.first_ts, other.last_ts)
        for m, h in other.hists.items():
            self.hist(m).add(h)
        for m, v in other.sums.items():
            self.sums[m] = self.sums.get(m, 0.0) + v
        self.estimated += other.estimated
        self._add_kinds(other.estimate_kinds)
        self._add_links(other.links_estimated)
        self.turns.merge(other.turns)

    @property
    def stopped(self) -> int:
        return self.errors_by_status.get(STOPPED, 0)

    @property
    def errors(self) -> int:
        return self.requests - self.ok - self.stopped

    def summary(self) -> RouteSummary:
        span = (self.last_ts - self.first_ts) if self.first_ts is not None and self.last_ts is not None else 0.0
        out: RouteSummary = {
            "requests": self.requests,
            "ok": self.ok,
            "errors": self.errors,
            "stopped": self.stopped,
            "errors_by_status": {k: v for k, v in sorted(self.errors_by_status.items()) if k != STOPPED},
            "rps": round(self.requests / span, 3) if span > 0 else None,
            #: requests whose network includes an estimate (the link to a component that reports
            #: nothing: a measured transport round trip, the rest of that link is unsplit)
            "network_estimated": self.estimated,
            #: of those, how many by estimator (pathprobe.rtt: http-null-rtt, tcp-handshake, h2-ping;
            #: a forwarder's <kind>.connect), and per link (outermost first) how many had that link estimated
            "network_estimate_kind": dict(sorted(self.estimate_kinds.items())),
            "links_estimated": list(self.links_estimated),
            "metrics": {m: hist.stats(self.hists[m], self.sums.get(m)) for m in METRICS if m in self.hists},
        }
        if self.turns:
            out["turns"] = self.turns.summary()
        return out


class Aggregator:
    """Counts and histograms per route; a pending batch of raw records."""

    def __init__(self) -> None:
        self.routes: dict[str, RouteAgg] = {}
        self.pending: list[Record] = []

    def add(self, rec: Record) -> None:  # hot path: one append
        self.pending.append(rec)

    def route(self, name: str) -> RouteAgg:
        r = self.routes.get(name)
        if r is None:
            r = self.routes[name] = RouteAgg()
        return r

    def take_pending(self) -> list[Record]:
        batch, self.pending = self.pending, []
        return batch

    def add_batch(self, batch: list[Record]) -> None:
        by_route: dict[str, list[Record]] = {}
        for rec in batch:
            # call-by-call interleaving (--mix): one route per configuration
            key = f"{rec['config']}/{rec['route']}" if "config" in rec else rec["route"]
            by_route.setdefault(key, []).append(rec)
        for name, recs in by_route.items():
            self.route(name).add_records(recs)

    def flush(self, sink: Callable[[list[Record]], None] | None = None) -> list[Record]:
        batch = self.take_pending()
        if batch:
            self.add_batch(batch)
            if sink is not None:
                sink(batch)
        return batch

    def merge(self, other: Aggregator) -> None:
        for name, r in other.routes.items():
            self.route(name).merge(r)

    # -- shipping -------------------------------------------------------------------
    def to_wire(self) -> dict[str, RouteWire]:
        return {name: r.to_wire() for name, r in self.routes.items()}

    def merge_wire(self, data: Mapping[str, RouteWire]) -> None:
        for name, rdata in data.items():
            self.route(name).merge_wire(rdata)

    # -- results --------------------------------------------------------------------
    def totals(self) -> Totals:
        req = sum(r.requests for r in self.routes.values())
        ok = sum(r.ok for r in self.routes.values())
        by: dict[str, int] = {}
        for r in self.routes.values():
            for st, n in r.errors_by_status.items():
                by[st] = by.get(st, 0) + n
        stopped = by.pop(STOPPED, 0)
        return {
            "requests": req,
            "ok": ok,
            "errors": req - ok - stopped,
            "stopped": stopped,
            "errors_by_status": dict(sorted(by.items())),
        }

    def summary(self, meta: Mapping[str, object]) -> Summary:
        return {
            "meta": meta,
            "totals": self.totals(),
            "routes": {name: r.summary() for name, r in sorted(self.routes.items())},
        }

    def histograms(self) -> dict[str, RouteWire]:
        return {name: r.to_wire() for name, r in sorted(self.routes.items())}
