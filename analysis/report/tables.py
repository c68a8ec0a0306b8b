"""The report's tables as :class:`~pathprobe.analysis.report.blocks.Table` blocks: the path tax,
every figure side by side per concurrency, and ``pathprobe analyze``'s segments per route; with the
cell formats they share."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from pathprobe import rtt
from pathprobe.analysis.report.blocks import Row, Table
from pathprobe.analysis.report.figures import PathTaxRow, percentiles
from pathprobe.analysis.report.model import (
    Estimate,
    Frontier,
    FrontierKnee,
    FrontierPoint,
    FrontierSearch,
    FrontierTarget,
    Group,
    Report,
    Scorecard,
    Target,
)
from pathprobe.segments import SEGMENTS
from pydantic import JsonValue

ESTIMATED = "est."

ESTIMATED_NOTE = (
    "network marked est.: the link to a component that reports nothing (a server we did not "
    "write) holds its network and its work; only a round trip measured apart (an HTTP null "
    "round trip on the load generator's connection, else a TCP handshake or HTTP/2 PING) is "
    "booked as network of that link, the rest of that link is unsplit"
)

PATH_TAX_CAPTION = (
    "path tax per call (everything but the engine; p50 ms; calls interleaved one by one, each paired with "
    "the call of the same cycle to the configuration under 'vs': the direct path of its own client protocol)"
)


def fmt_ms(v: float | None, digits: int = 3) -> str:
    """A figure for a cell: ``–`` where there is none (or it was NaN)."""
    if v is None or math.isnan(v):
        return "–"
    return f"{v:.{digits}f}"


def _signed(v: float | None, fmt: str) -> str:
    return "–" if v is None or math.isnan(v) else format(v, fmt)


def estimated_note(groups: Iterable[Group]) -> str:
    """:data:`ESTIMATED_NOTE` with the estimators these groups used, in words."""
    kinds = sorted({k for g in groups for k in g.network_estimate_kind})
    if not kinds:
        return ESTIMATED_NOTE
    return ESTIMATED_NOTE + " (estimated here by " + "; ".join(f"{k}: {rtt.describe(k)}" for k in kinds) + ")"


def seg_cell(group: Group, seg: str) -> str:
    """A segment's mean for a table cell; network is marked when any of it is an estimate."""
    text = fmt_ms(group.segment_mean(seg))
    if seg == "network" and group.network_estimated:
        text += f" {ESTIMATED}"
    return text


def placement_line(pl: Mapping[str, JsonValue]) -> str:
    """Where the processes ran (report.json ``meta.placement``)."""
    engine = "; engine in a process of its own" if pl.get("engine_process") else ""
    if not pl.get("enabled"):
        return f"CPU placement: off ({pl.get('reason', '')}){engine}"

    def cores(key: str) -> str:
        got = pl.get(key)
        return ",".join(map(str, got)) if isinstance(got, list) else ""

    return (
        f"CPU placement: engine/server on cores {cores('server')}, gateways/nginx/relays on {cores('proxies')}, "
        f"load generator on {cores('load')} ({pl.get('reason', '')}){engine}"
    )


PATH_TAX_COLUMNS = (
    "config",
    "path tax",
    "network hop 1",
    "network hop 2+",
    "serialization",
    "other",
    "engine",
    "vs",
    "Δ path tax",
    "95% CI",
    "pairs",
    "verdict",
)


def _path_tax_row(r: PathTaxRow) -> Row:
    d = r.diff or Estimate()
    cells = (
        r.config + (" (base)" if r.baseline else ""),
        *(fmt_ms(v) for v in (r.path_tax, r.network_hop1, r.network_hop2, r.serialization, r.other, r.engine)),
        r.against or "–",
        _signed(d.value, "+.3f"),
        f"{d.lo:+.3f} – {d.hi:+.3f}" if d.lo is not None and d.hi is not None else "–",
        "–" if r.pairs is None else str(r.pairs),
        r.verdict or "–",
    )
    return Row(cells, key=r.config, hint=r.why)


def path_tax_table(rows: Sequence[PathTaxRow], conc: int) -> Table:
    """Each configuration's path tax (its cost beside the engine) at one concurrency."""
    return Table(
        PATH_TAX_COLUMNS,
        tuple(_path_tax_row(r) for r in rows),
        caption=f"{PATH_TAX_CAPTION}, concurrency {conc}",
        left=frozenset({0, 7, 9, 11}),
        kind="path-tax",
        concurrency=conc,
    )


def group_columns(report: Report) -> tuple[str, ...]:
    stream = ("TTFT p50", "ITL p50") if report.method.stream else ()
    return (
        "config",
        "ok",
        "err",
        "req/s",
        f"{report.primary} p50",
        "95% CI",
        "p95",
        "p99",
        *SEGMENTS,
        "hop1",
        "hop2",
        "Δp50 vs base",
        "p (Welch, Holm)",
        "Cliff's δ",
        "Cohen's d",
        *stream,
    )


def _name_cell(report: Report, name: str, t: Target, g: Group) -> str:
    return (
        name
        + (" (base)" if name == report.baseline else "")
        + (" FAILED" if t.status == "failed" else "")
        + (" [client saturated]" if g.client is not None and g.client.saturated else "")
    )


def _group_row(report: Report, name: str, t: Target, g: Group) -> Row:
    p = g.metric(report.primary)
    est = {q: (getattr(p, q, None) if p is not None else None) or Estimate() for q in ("p50", "p95", "p99")}
    c = g.comparison
    stream = (
        (fmt_ms(g.ttft.p50 if g.ttft else None), fmt_ms(g.itl.p50 if g.itl else None)) if report.method.stream else ()
    )
    cells = (
        _name_cell(report, name, t, g),
        str(g.ok),
        str(g.errors),
        fmt_ms(g.rps, 1),
        fmt_ms(est["p50"].value),
        f"{fmt_ms(est['p50'].lo)} – {fmt_ms(est['p50'].hi)}",
        fmt_ms(est["p95"].value),
        fmt_ms(est["p99"].value),
        *(seg_cell(g, s) for s in SEGMENTS),
        *(fmt_ms(g.segment_mean(s)) for s in ("network_hop1", "network_hop2")),
        _signed(c.p50_diff_ms, "+.3f") if c else "–",
        _signed(c.p_adjusted, ".2g") if c else "–",
        f"{_signed(c.cliffs_delta, '+.2f')} ({c.magnitude})" if c else "–",
        _signed(c.cohens_d, "+.2f") if c else "–",
        *stream,
    )
    return Row(cells, status=t.status, key=name)


def group_table(report: Report, conc: int) -> Table:
    """Every configuration's figures at one concurrency, side by side."""
    rows = []
    for name, t in report.targets.items():
        g = t.at(conc)
        if g is not None:
            rows.append(_group_row(report, name, t, g))
        elif t.problem:
            rows.append(Row((name, f"{t.status}: {t.reason or ''}"), span=True, status=t.status, key=name))
        else:
            rows.append(Row((name, "(no run at this concurrency)"), span=True, key=name))
    return Table(group_columns(report), tuple(rows), left=frozenset({0, 5}), concurrency=conc)


SEGMENT_TABLE_COLUMNS = ("e2e", *SEGMENTS, "network_hop1", "network_hop2")


def segment_table(by_route: Mapping[str, Sequence[Mapping[str, float]]]) -> Table:
    """p50/p95/p99 (and mean) per segment per route (``pathprobe analyze``'s table)."""
    cols = SEGMENT_TABLE_COLUMNS
    rows = []
    for route, splits in sorted(by_route.items()):
        per = {c: percentiles([s[c] for s in splits]) for c in cols}
        for metric in ("mean", "p50", "p95", "p99"):
            first = metric == "mean"
            cells = (route if first else "", str(len(splits)) if first else "", metric)
            rows.append(Row(cells + tuple(f"{per[c][metric]:.3f}" for c in cols)))
    heads = tuple(c.replace("network_", "") for c in cols)
    return Table(("route", "n", "metric", *heads), tuple(rows), left=frozenset({0, 2}))


def _est(e: Estimate | None) -> str:
    if e is None or e.value is None:
        return "–"
    if e.lo is None or e.hi is None:
        return fmt_ms(e.value)
    return f"{fmt_ms(e.value)} [{fmt_ms(e.lo)}, {fmt_ms(e.hi)}]"


def _mb(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def score_table(card: Scorecard, stream: bool) -> Table:
    """One row per configuration: added p50/p99 (and TTFT, chunk gap on streams), buffering, CPU, RSS."""
    cols: tuple[str, ...] = ("config", "vs", "pairs", "added p50 ms", "added p99 ms")
    if stream:
        cols += ("added TTFT p50", "added TTFT p99", "added gap p50", "added gap p99", "buffering")
    cols += ("CPU ms/req", "RSS rest MB", "RSS load MB")
    bounds = sorted({b for r in card.rows for b in r.frontier_rps or {}}, key=float)
    cols += tuple(f"rps @ p99 +{b} ms" for b in bounds)
    rows = []
    for r in card.rows:
        cells = [r.target, r.against, str(r.pairs), _est(r.added_p50), _est(r.added_p99)]
        if stream:
            buffering = "–" if r.buffering is None else ("BUFFERS" if r.buffering else "streams through")
            cells += [
                _est(r.added_ttft_p50),
                _est(r.added_ttft_p99),
                _est(r.added_gap_p50),
                _est(r.added_gap_p99),
                buffering,
            ]
        cpu = "–" if r.cpu_ms_per_request is None else f"{r.cpu_ms_per_request:.3f}"
        cells += [cpu, _mb(r.rss_rest_mb), _mb(r.rss_load_mb)]
        cells += [knee_cell((r.frontier_rps or {}).get(b)) for b in bounds]
        rows.append(Row(tuple(cells), key=r.target))
    left = frozenset({0, 1, cols.index("buffering")}) if stream else frozenset({0, 1})
    return Table(cols, tuple(rows), left=left, kind="scorecard", anchor="scorecard")


def load_text(v: float) -> str:
    """A load as read: three significant digits (a bisected rate is 29.7, not 29.7302), whole above 1000."""
    return f"{v:.0f}" if v >= 1000 else f"{v:.3g}"


def knee_cell(k: FrontierKnee | None) -> str:
    """A knee as read: the load that held; '≥' when nothing measured crossed the bound; '<' when even
    the first load did."""
    if k is None:
        return "–"
    if k.load is None:
        return "–" if k.next_load is None else f"< {load_text(k.next_load)}"
    return f"≥ {load_text(k.load)}" if k.next_load is None else load_text(k.load)


def _held_point(search: FrontierSearch) -> FrontierPoint | None:
    """The highest load that held the largest bound, else the lowest measured: where CPU and RSS are read."""
    held = [k.load for k in search.knees if k.load is not None]
    return search.at(max(held)) if held else (search.points[0] if search.points else None)


def _frontier_row(name: str, t: FrontierTarget, bounds: Sequence[float], stream: bool) -> Row:
    cells = [name, t.against]
    u = t.unary
    cells += [knee_cell(u.knee(b) if u is not None else None) for b in bounds]
    if stream:
        cells.append(knee_cell(t.stream.knees[0] if t.stream is not None and t.stream.knees else None))
    at = _held_point(u) if u is not None else None
    cells += [
        "–" if at is None else load_text(at.load),
        "–" if at is None or at.cpu_ms_per_request is None else f"{at.cpu_ms_per_request:.3f}",
        _mb(at.rss_mb if at is not None else None),
        str(sum(len(s.points) for s in (u, t.stream) if s is not None)),
        "; ".join(f"{load_text(s.refused[0].load)}: {s.refused[0].reason}" for s in (u, t.stream) if s and s.refused)
        or "–",
    ]
    return Row(tuple(cells), key=name)


def frontier_table(fr: Frontier) -> Table:
    """One row per configuration: the most requests/s under each added-p99 bound (and streams under the
    gap bound), with the path's CPU and RSS at the highest load that held, and the refused steps."""
    bounds = fr.bounds_ms
    stream = any(t.stream is not None for t in fr.targets.values())
    cols = ("config", "vs", *(f"rps @ p99 +{b:g} ms" for b in bounds))
    if stream:
        cols += (f"streams @ gap p99 +{fr.stream_bound_ms or 0:g} ms",)
    cols += ("CPU/RSS at rps", "CPU ms/req", "RSS MB", "steps", "refused (client saturated)")
    rows = tuple(_frontier_row(name, t, bounds, stream) for name, t in fr.targets.items())
    return Table(cols, rows, left=frozenset({0, 1, len(cols) - 1}), kind="frontier")
