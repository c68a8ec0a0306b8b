"""A payload sweep's figures: each configuration's path tax against payload size.

For every configuration, concurrency and (prompt_tokens, max_tokens) point: the bytes of the
request and the response as the client measured them on its link (never estimated from tokens),
each reporting hop's serialization as a mean and per MB of those bytes, the network per link, the
path tax and, for streams, the time to the first token. A path whose hops forward bytes unchanged
(passthrough) keeps its hops' serialization flat as the payload grows; a path that re-encodes
(transcode) grows with it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from pathprobe.analysis.report import paired as paired_mod
from pathprobe.analysis.report.blocks import Block, Figure, Heading, Paragraph, Row, Table
from pathprobe.analysis.report.hops import summarize_hops
from pathprobe.analysis.report.model import Link, PayloadHop, PayloadRow, PayloadSweep, Report
from pathprobe.analysis.report.records import TaggedRecord
from pathprobe.records import SplitRecord

MB = 1e6  # bytes per MB (decimal, as network figures are)


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _per_mb(ms: float | None, nbytes: float | None) -> float | None:
    """``ms`` per MB of ``nbytes``; None where either is unknown or there are no bytes."""
    if ms is None or not nbytes:
        return None
    return ms / (nbytes / MB)


def _bytes(ok: Sequence[TaggedRecord]) -> tuple[float | None, float | None]:
    """Median request and response bytes of the requests that carry them (the client measured them)."""
    req = [float(n) for r in ok if (n := r.get("request_bytes"))]
    resp = [float(r.get("response_bytes", 0)) for r in ok if r.get("request_bytes")]
    return _median(req), _median(resp)


def _splits(ok: Sequence[TaggedRecord]) -> list[SplitRecord]:
    return [sp for r in ok if (sp := r["split"]) is not None]


def payload_row(
    target: str, conc: int, point: tuple[int, int], records: Sequence[TaggedRecord], names: Sequence[str] | None
) -> PayloadRow:
    """One configuration's figures at one concurrency and payload point."""
    ok = [r for r in records if r.get("ok") and r.get("split")]
    failed = [r for r in records if not r.get("ok") and r.get("status") != "STOPPED"]
    row = PayloadRow(
        target=target, concurrency=conc, prompt_tokens=point[0], max_tokens=point[1], n=len(ok), errors=len(failed)
    )
    if failed:
        row.first_error = f"{failed[0].get('status')}: {failed[0].get('error')}"
    if not ok:
        return row
    req, resp = _bytes(ok)
    total = (req or 0.0) + (resp or 0.0) if req is not None else None
    row.request_bytes, row.response_bytes = req, resp
    row.e2e_p50 = _median([float(r["e2e_ms"]) for r in ok])
    row.ttft_p50 = _median([t for r in ok if (t := r["ttft_ms"]) is not None])
    row.path_tax_p50 = paired_mod.tax_summary(ok)["path_tax"]["p50"]
    row.serialization_mean_ms = statistics.fmean(sp["serialization"] for sp in _splits(ok))
    client = statistics.fmean(float(r["client_encode_ms"]) + float(r["client_decode_ms"]) for r in ok)
    row.client_ms_per_mb = _per_mb(client, total)
    path = summarize_hops(ok, names)
    if path is not None:
        row.hops = [
            PayloadHop(
                label=h["label"],
                serialization_mean_ms=h["serialization_mean_ms"],
                ms_per_mb=_per_mb(h["serialization_mean_ms"], total),
            )
            for h in path["hops"]
        ]
        row.links = [Link.model_validate(link) for link in path["links"]]
    return row


# ---------------------------------------------------------------- the report's section


def _fmt(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _kb(v: float | None) -> str:
    return "–" if v is None else f"{v / 1e3:.1f}"


def _hops_cell(row: PayloadRow) -> str:
    """``gw (transcode) 0.41 ms (2.10 ms/MB); server 0.20 ms (1.02 ms/MB)``."""
    return "; ".join(f"{h.label} {_fmt(h.serialization_mean_ms, 3)} ms ({_fmt(h.ms_per_mb)} ms/MB)" for h in row.hops)


def _links_cell(row: PayloadRow) -> str:
    return "; ".join(f"{_fmt(link.mean_ms, 3)}" for link in row.links)


COLUMNS = (
    "configuration",
    "c",
    "prompt",
    "max",
    "n",
    "req KB",
    "resp KB",
    "e2e p50",
    "TTFT p50",
    "path tax p50",
    "client ms/MB",
    "serialization per hop: mean (per MB)",
    "network per link (ms)",
)


def _row(r: PayloadRow) -> Row:
    name = r.target + (f" [{r.errors} errors]" if r.errors else "")
    return Row(
        (
            name,
            str(r.concurrency),
            str(r.prompt_tokens),
            str(r.max_tokens),
            str(r.n),
            _kb(r.request_bytes),
            _kb(r.response_bytes),
            _fmt(r.e2e_p50),
            _fmt(r.ttft_p50),
            _fmt(r.path_tax_p50),
            _fmt(r.client_ms_per_mb),
            _hops_cell(r),
            _links_cell(r),
        )
    )


def payload_table(sweep: PayloadSweep) -> Table:
    rows = sorted(sweep.rows, key=lambda r: (r.target, r.concurrency, r.prompt_tokens, r.max_tokens))
    return Table(
        COLUMNS,
        tuple(_row(r) for r in rows),
        left=frozenset({0, 11, 12}),
        caption="Path tax against payload (ms; bytes measured by the client on its link; per MB: of the "
        "request + response bytes)",
    )


def limits_table(sweep: PayloadSweep) -> Table:
    return Table(
        ("where", "setting", "value", "why"),
        tuple(Row((lim.where, lim.setting, lim.value, lim.why)) for lim in sweep.limits),
        left=frozenset({0, 1, 3}),
        caption="Limits compare set on every hop for the sweep's largest payload",
    )


def section(report: Report) -> list[Block]:
    """The payload sweep's heading, table, limits and figure ([] when the run swept no payload)."""
    sweep = report.payload
    if sweep is None or not sweep.rows:
        return []
    points = ", ".join(f"{p}/{m}" for p, m in sweep.points)
    out: list[Block] = [
        Heading("Payload sweep", 2),
        Paragraph(
            f"prompt/max tokens: {points}; the sections above hold the first point "
            f"({sweep.primary[0] if sweep.primary else '?'}/{sweep.primary[1] if sweep.primary else '?'})"
        ),
        payload_table(sweep),
    ]
    if sweep.limits:
        out.append(limits_table(sweep))
    from pathprobe.analysis.report.plots_payload import plot_payload

    out.append(
        Figure(
            "Path tax and hop serialization against payload",
            "per configuration at its lowest concurrency: path tax p50 and each hop's serialization (mean) "
            "against the request + response bytes",
            lambda: plot_payload(report),
        )
    )
    return out
