"""Per-request records and their exact aggregation (per route, per metric).

A record is a :class:`pathprobe.records.RequestRecord` (the JSONL schema, defined there).
:class:`Aggregator` keeps request/ok/error counts and one HDR histogram per route and
metric. Records are appended to a pending batch on the hot path; :meth:`Aggregator.flush`
moves the batch into the histograms (vectorised) and hands it to a sink (JSONL file or
the master). Histogram deltas can be shipped as encoded text and merged exactly.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from hdrh.histogram import HdrHistogram
from pathprobe import rtt
from pathprobe.loadgen import hist
from pathprobe.records import SPLIT_SEGMENTS, RequestRecord

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

    def _add_links(self, counts: list[int]) -> None:
        if len(counts) > len(self.links_estimated):
            self.links_estimated += [0] * (len(counts) - len(self.links_estimated))
        for j, n in enumerate(counts):
            self.links_estimated[j] += n

    def _add_kinds(self, kinds: dict[str, int]) -> None:
        for k, n in kinds.items():
            self.estimate_kinds[k] = self.estimate_kinds.get(k, 0) + n

    def to_wire(self) -> dict[str, Any]:
        return {
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

    def merge_wire(self, data: dict[str, Any]) -> None:
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

    @property
    def stopped(self) -> int:
        return self.errors_by_status.get(STOPPED, 0)

    @property
    def errors(self) -> int:
        return self.requests - self.ok - self.stopped

    def summary(self) -> dict[str, Any]:
        span = (self.last_ts - self.first_ts) if self.first_ts is not None and self.last_ts is not None else 0.0
        return {
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
    def to_wire(self) -> dict[str, Any]:
        return {name: r.to_wire() for name, r in self.routes.items()}

    def merge_wire(self, data: dict[str, Any]) -> None:
        for name, rdata in data.items():
            self.route(name).merge_wire(rdata)

    # -- results --------------------------------------------------------------------
    def totals(self) -> dict[str, Any]:
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

    def summary(self, meta: dict[str, Any]) -> dict[str, Any]:
        return {
            "meta": meta,
            "totals": self.totals(),
            "routes": {name: r.summary() for name, r in sorted(self.routes.items())},
        }

    def histograms(self) -> dict[str, dict[str, Any]]:
        return {name: r.to_wire() for name, r in sorted(self.routes.items())}


try:
    import orjson

    def dumps_lines(batch: list[Record]) -> str:
        return b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in batch).decode()

except ImportError:  # pragma: no cover - orjson is a dependency; stdlib fallback
    _enc = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

    def dumps_lines(batch: list[Record]) -> str:
        return "".join(_enc(r) + "\n" for r in batch)


class JsonlWriter:
    """Appends records to ``records.jsonl`` (opened lazily, flushed per batch)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fh: TextIO | None = None

    def open_fresh(self) -> None:
        self.close()
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._fh = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - held across batches, closed in close()

    def __call__(self, batch: list[Record]) -> None:
        if self._fh is None:
            self.open_fresh()
        assert self._fh is not None
        self._fh.write(dumps_lines(batch))
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def write_outputs(
    out_dir: str, agg: Aggregator, meta: dict[str, Any], name: str = "summary", client: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``<name>.json``, ``<name>.csv`` and (for the main summary) ``histograms.json``.

    ``client``: the load generator's own health (event-loop lag, CPU, saturated; see
    :mod:`pathprobe.loadgen.monitor`), written as summary.json's ``client`` block."""
    os.makedirs(out_dir, exist_ok=True)
    summary = agg.summary(meta)
    summary["client"] = client
    with open(os.path.join(out_dir, f"{name}.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    with open(os.path.join(out_dir, f"{name}.csv"), "w", newline="", encoding="utf-8") as fh:
        cols = ["count", "min", "mean", "p50", "p90", "p95", "p99", "p999", "max"]
        w = csv.writer(fh)
        w.writerow(["route", "metric", *cols])
        for route, rs in summary["routes"].items():
            for metric, st in rs["metrics"].items():
                w.writerow([route, metric, *(st.get(c, "") for c in cols)])
    if name == "summary":
        with open(os.path.join(out_dir, "histograms.json"), "w", encoding="utf-8") as fh:
            json.dump(agg.histograms(), fh)
    return summary


TABLE_METRICS = (
    "e2e",
    "network",
    "serialization",
    "queueing",
    "inference",
    "other",
    "unsplit",
    "ttft",
    "itl",
    "schedule_lag",
    "client_wait",
)


def format_table(summary: dict[str, Any]) -> str:
    """Per-route p50/p95/p99 of e2e, each segment, TTFT/ITL (ms)."""
    lines: list[str] = []
    for route, rs in summary["routes"].items():
        errs = ", ".join(f"{k}={v}" for k, v in rs["errors_by_status"].items()) or "none"
        rps = f"{rs['rps']:.1f} req/s" if rs.get("rps") else "-"
        lines.append(
            f"{route}: {rs['requests']} requests, {rs['ok']} ok, errors: {errs}, "
            f"{rs['stopped']} stopped in flight, {rps}"
        )
        lines.append(f"  {'metric (ms)':<16}{'p50':>11}{'p95':>11}{'p99':>11}{'max':>11}{'count':>9}")
        for m in TABLE_METRICS:
            st = rs["metrics"].get(m)
            if not st or not st.get("count"):
                continue
            if m in ("schedule_lag", "unsplit", "client_wait") and st["max"] == 0:
                continue
            label = m
            if m == "network" and rs.get("network_estimated"):
                label = "network (est.)"  # a round trip measured apart stands for the silent link's network
            lines.append(
                f"  {label:<16}{st['p50']:>11.3f}{st['p95']:>11.3f}{st['p99']:>11.3f}{st['max']:>11.3f}{st['count']:>9}"
            )
    t = summary["totals"]
    lines.append(
        f"total: {t['requests']} requests, {t['ok']} ok, {t['errors']} errors, {t['stopped']} stopped in flight"
    )
    if any(rs.get("network_estimated") for rs in summary["routes"].values()):
        kinds = sorted({k for rs in summary["routes"].values() for k in rs.get("network_estimate_kind") or {}})
        links = sorted(
            {j + 1 for rs in summary["routes"].values() for j, n in enumerate(rs.get("links_estimated") or ()) if n}
        )
        lines.append(
            "network (est.): the link to a server that reports nothing holds its network and its "
            "work; only a round trip measured apart is booked as network, the rest is unsplit "
            f"(estimated: link {', '.join(map(str, links)) or '?'} of the path, by "
            + "; ".join(f"{k}: {rtt.describe(k)}" for k in kinds)
            + ")"
        )
    return "\n".join(lines)
