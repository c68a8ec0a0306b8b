"""What a run writes: ``records.jsonl`` (batch by batch), ``summary.json`` / ``.csv`` and
``histograms.json`` from an :class:`~pathprobe.loadgen.records.Aggregator`, and the per-route
table a headless run prints."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from typing import IO

from pathprobe import rtt
from pathprobe.loadgen.monitor import ClientBlock
from pathprobe.loadgen.records import Aggregator, Record, Summary
from pathprobe.loadgen.turns import format_turns
from pathprobe.records import timing_only

try:
    import orjson

    def dumps_lines(batch: list[Record]) -> bytes:
        """One UTF-8 JSON line per record (bytes: written as they are, never decoded and re-encoded)."""
        dumps, opt = orjson.dumps, orjson.OPT_APPEND_NEWLINE
        return b"".join([dumps(r, option=opt) for r in batch])

except ImportError:  # pragma: no cover - orjson is a dependency; stdlib fallback
    _enc = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

    def dumps_lines(batch: list[Record]) -> bytes:
        return "".join(_enc(r) + "\n" for r in batch).encode()


class JsonlWriter:
    """Appends records to ``records.jsonl`` (opened lazily, flushed per batch); ``detail``
    ``timing`` writes each as :func:`pathprobe.records.timing_only`."""

    def __init__(self, path: str, detail: str = "full") -> None:
        self.path = path
        self.timing = detail == "timing"
        self._fh: IO[bytes] | None = None

    def open_fresh(self) -> None:
        self.close()
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._fh = open(self.path, "wb")  # noqa: SIM115 - held across batches, closed in close()

    def __call__(self, batch: list[Record]) -> None:
        if self._fh is None:
            self.open_fresh()
        assert self._fh is not None
        self._fh.write(dumps_lines([timing_only(r) for r in batch] if self.timing else batch))
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class SummaryFile(Summary):
    """summary.json: the aggregate's summary and the load generator's own ``client`` block."""

    client: ClientBlock | None


def write_outputs(
    out_dir: str,
    agg: Aggregator,
    meta: Mapping[str, object],
    name: str = "summary",
    client: ClientBlock | None = None,
) -> SummaryFile:
    """``<name>.json``, ``<name>.csv`` and (for the main summary) ``histograms.json``.

    ``client``: the load generator's own health (event-loop lag, CPU, saturated; see
    :mod:`pathprobe.loadgen.monitor`), written as summary.json's ``client`` block."""
    os.makedirs(out_dir, exist_ok=True)
    s = agg.summary(meta)
    summary: SummaryFile = {"meta": s["meta"], "totals": s["totals"], "routes": s["routes"], "client": client}
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


def format_table(summary: Summary) -> str:
    """Per-route p50/p95/p99 of e2e, each segment, TTFT/ITL (ms); with ``--sessions`` the figures by turn."""
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
        if rs.get("turns"):  # --sessions: TTFT and the server's cached share, turn by turn
            lines += format_turns(rs["turns"])
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
