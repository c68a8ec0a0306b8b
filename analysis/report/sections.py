"""The compare report's sections: each a small function from the typed report to neutral blocks
(:mod:`pathprobe.analysis.report.blocks`), written once and shown by every writer (Markdown, HTML).

A section is ``def my_section(page: Page) -> list[Block]``; add it to :data:`SECTIONS` where it
belongs in the page, and it appears in report.md, on stdout and in report.html. The figures it
needs come from ``page.report`` (the typed :class:`~pathprobe.analysis.report.model.Report`);
a figure's records (the waterfalls, the streaming CDFs) from ``page.records``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pathprobe.analysis.report import plots
from pathprobe.analysis.report.blocks import Block, Code, Figure, Heading, Note, Notes, Paragraph, Row, Table, Title
from pathprobe.analysis.report.figures import path_tax_rows
from pathprobe.analysis.report.model import Propagation, Report
from pathprobe.analysis.report.notes import run_note
from pathprobe.analysis.report.tables import (
    ESTIMATED_NOTE,
    estimated_note,
    fmt_ms,
    frontier_table,
    group_table,
    path_tax_table,
    placement_line,
    score_table,
)
from pathprobe.records import RequestRecord

#: each configuration's records per concurrency (rounds pooled), for the plots that draw requests
Records = Mapping[str, Mapping[int, Sequence[RequestRecord]]]


@dataclass(frozen=True, slots=True)
class Page:
    """What the sections read: the report, and the records behind it where a plot needs them."""

    report: Report
    records: Records = field(default_factory=dict)


Section = Callable[[Page], list[Block]]


#: how the figures are paired, in one line (the method in full is at the end of the page)
PAIRING_LINE = (
    "calls to every configuration interleaved one by one; each configuration paired with the direct path of "
    "its own client protocol, call by call (method: at the end)"
)


def header(page: Page) -> list[Block]:
    """Title, when and where, the placement, how the figures are paired, what held for the whole run (the
    machine's load, said once), the network conditions."""
    r, meta = page.report, page.report.meta
    out: list[Block] = [Title(f"pathprobe compare — {meta.engine}")]
    version = meta.versions.get("pathprobe", "")
    out.append(Paragraph(f"{meta.started} · {meta.host} · {meta.cpus or ''} CPUs · pathprobe {version}", muted=True))
    if meta.placement:
        out.append(Paragraph(placement_line(meta.placement), muted=True))
    out.append(Paragraph(PAIRING_LINE if r.interleaved else f"baseline: {r.baseline} (method: at the end)"))
    machine = run_note(r)
    if machine is not None:
        out.append(Notes((machine,)))
    if r.network:
        net = r.network
        out.append(
            Paragraph(
                f"network condition on hop '{net.hop}': {net.describe} (expected: +{net.expected_request_ms or 0:g} ms "
                "per request: one-way delay x 2 traversals)"
            )
        )
    own = [
        Note(f"{n}: network condition on hop '{tn.hop}': {tn.describe} (expected +{tn.expected_request_ms or 0:g} ms)")
        for n, t in r.targets.items()
        if (tn := t.network) is not None and tn != r.network
    ]
    return [*out, Notes(tuple(own))] if own else out


def lead_figure(page: Page) -> list[Block]:
    """One figure first: what each configuration adds over its own protocol's direct path, by segment."""
    card = page.report.scorecard
    if card is None or not card.rows:
        return []
    caption = "stacked: mean paired difference per segment; marker: added p50 with its 95 % interval"
    return [Figure("What each configuration adds", caption, lambda: plots.plot_scorecard(page.report), "lead-figure")]


def scorecard(page: Page) -> list[Block]:
    """The scorecard: added latency, TTFT and chunk gap, buffering, CPU and memory per configuration."""
    card = page.report.scorecard
    if card is None or not card.rows:
        return []
    stream = any(r.added_ttft_p50 is not None for r in card.rows)
    return [
        Heading(f"Scorecard: what each configuration adds (concurrency {card.concurrency})"),
        score_table(card, stream),
        Paragraph(card.formula, muted=True),
    ]


def frontier(page: Page) -> list[Block]:
    """The throughput frontier: the most load each configuration carries under each added-p99 bound."""
    fr = page.report.frontier
    if fr is None or not fr.targets:
        return []
    refused = [
        Note(f"{kind} at {p.load:g}: {p.reason}", label="REFUSED", kind="client-warning", subject=name)
        for name, t in fr.targets.items()
        for kind, s in (("rps", t.unary), ("streams", t.stream))
        if s is not None
        for p in s.refused
    ]
    out: list[Block] = [
        Heading("Throughput frontier: the most load under each bound on what the path adds"),
        frontier_table(fr),
        Paragraph(
            "rps: requests/s that held (added p99 under the bound, no error); ≥: no step measured crossed it; "
            "<: even the first step did. " + fr.method,
            muted=True,
        ),
        Figure("Throughput frontier", "added p99 over the direct path at each step", lambda: plots.plot_frontier(fr)),
    ]
    return [*out, Notes(tuple(refused), intro="steps refused: the load generator saturated")] if refused else out


def propagation(page: Page) -> list[Block]:
    """Trace propagation, checked before the run: what each hop did with the client's traceparent."""
    rows = [
        Row((name, "holds" if t.propagation.holds else "BREAKS", _hops_text(t.propagation)), key=name)
        for name, t in page.report.targets.items()
        if t.propagation is not None
    ]
    if not rows:
        return []
    note = (
        "own span: the hop traced the request under the context it received; passes unchanged: it forwarded "
        "the traceparent as is (expected of a proxy that does not trace: the chain holds, the hop is not in "
        "the waterfall); new root: the context was dropped or replaced and the waterfall falls apart there"
    )
    table = Table(
        ("config", "trace", "hops, outermost first"), tuple(rows), left=frozenset({0, 1, 2}), kind="propagation"
    )
    return [Heading("Trace propagation"), table, Paragraph(note, muted=True)]


def _hops_text(found: Propagation) -> str:
    return "; ".join(f"{h.hop}: {h.verdict}" for h in found.hops) or found.error


def path_tax(page: Page) -> list[Block]:
    """The lead (interleaved runs): each configuration's path tax beside the engine, per concurrency."""
    tables = [path_tax_table(rows, c) for c in page.report.concurrency if (rows := path_tax_rows(page.report, c))]
    if not tables:
        return []
    return [Heading("Path tax: what each configuration costs beside the engine"), *tables]


def concurrency(page: Page) -> list[Block]:
    """Per concurrency: every figure side by side, then what to know about them."""
    out: list[Block] = []
    for conc in page.report.concurrency:
        out += [Heading(f"concurrency {conc}"), group_table(page.report, conc)]
        est = [g for t in page.report.targets.values() if (g := t.at(conc)) is not None and g.network_estimated]
        if est:
            out.append(Paragraph(estimated_note(est) + "."))
        out += [b for b in (_warnings(page.report, conc), _hops(page.report, conc)) if b.items]
        out.append(_findings(page.report, conc))
    return out


def _warnings(r: Report, conc: int) -> Notes:
    """The load generator's health, the accounting, streamed chunks and missing server timing."""
    from pathprobe.analysis.report.notes import accounting_notes, group_warnings

    items = [  # a contended client (other processes took its core) is said once, in the header
        Note(w.text, "WARNING", "client-warning")
        for w in r.client_warnings
        if w.concurrency == conc and w.kind == "saturated"
    ]
    return Notes(tuple(items + accounting_notes(r, conc) + group_warnings(r, conc)))


def _hops(r: Report, conc: int) -> Notes:
    from pathprobe.analysis.report.hops import format_path

    paths = [(n, g.path) for n, t in r.targets.items() if (g := t.at(conc)) is not None and g.path]
    return Notes(
        tuple(Note(format_path(p), subject=n) for n, p in paths),
        intro="hop by hop (means, ms: the network of each link, and each reporting hop's own time and serialization)",
    )


def _findings(r: Report, conc: int) -> Notes:
    """Self-reports, the paths' CPU, the verdicts and what did not differ clearly."""
    from pathprobe.analysis.report.notes import cpu_note, verdict_notes

    items = [
        Note(s.text, "self-report", "self-report", subject=s.target) for s in r.self_reports if s.concurrency == conc
    ]
    return Notes(tuple(items + cpu_note(r, conc) + verdict_notes(r, conc)))


FIGURES: tuple[tuple[str, str, Callable[[Page], str | None]], ...] = (
    (
        "Where the time goes",
        "Mean milliseconds per request in each segment; the bar's length is the mean end-to-end time.",
        lambda p: plots.plot_segments(p.report),
    ),
    (
        "Hop by hop",
        "Each path from the client inwards: the network of every link (numbered), each reporting "
        "hop's serialization and own time, the server's queue and inference (means).",
        lambda p: plots.plot_hops(p.report),
    ),
    (
        "Latency distribution",
        "Empirical CDF of every measured request (rounds pooled).",
        lambda p: plots.plot_cdfs(p.report),
    ),
    (
        "One request, hop by hop",
        "A typical request (median end-to-end, highest concurrency) of each configuration: client, each "
        "reporting hop, the server and its engine phases; a part inside a component that reports nothing "
        "is hatched (unsplit), with the phases its engine reported drawn inside it.",
        lambda p: plots.plot_waterfalls(p.report, p.records),
    ),
    (
        "Streaming: TTFT and inter-token latency",
        "Client-observed, highest concurrency.",
        lambda p: plots.plot_streaming(p.report, p.records),
    ),
    (
        "Concurrency sweep",
        "p50 with its 95% bootstrap interval, p99 dashed; throughput on the right.",
        lambda p: plots.plot_sweep(p.report),
    ),
)


def payload_sweep(page: Page) -> list[Block]:
    """A payload sweep's path tax against payload size, per configuration, and the limits set for it."""
    from pathprobe.analysis.report import payload

    return payload.section(page.report)


def figures(page: Page) -> list[Block]:
    """The plots (drawn only by a writer that shows them)."""
    return [Figure(title, caption, _bind(draw, page)) for title, caption, draw in FIGURES]


def _bind(draw: Callable[[Page], str | None], page: Page) -> Callable[[], str | None]:
    return lambda: draw(page)


def footnotes(page: Page) -> list[Block]:
    """How to read the segments, and the run's checks: traces, server start-up."""
    from pathprobe.analysis.report.notes import trace_notes

    r = page.report
    out: list[Block] = [
        Paragraph(
            "Segments are means per request in ms "
            "(network + serialization + queue + inference + other + unsplit = mean e2e)."
        )
    ]
    if any(g.network_estimated for t in r.targets.values() for g in t.by_concurrency.values()):
        out.append(Paragraph(ESTIMATED_NOTE + "."))
    notes = trace_notes(r)
    if r.server_startup_ms:
        notes.append(Note("server startup (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in r.server_startup_ms.items())))
    return [*out, Notes(tuple(notes))] if notes else out


def cold_start(page: Page) -> list[Block]:
    """The first request after each path came up, beside the warm-up's median."""
    cold = [(n, c) for n, t in page.report.targets.items() if (c := t.cold_start) is not None]
    if not cold:
        return []
    rows = tuple(Row((n, fmt_ms(c.first_ms), fmt_ms(c.warmup_p50_ms), str(c.n))) for n, c in cold)
    return [
        Heading("Cold start"),
        Table(
            ("config", "first request ms", "warm-up p50 ms", "warm-up requests"),
            rows,
            caption="first request after each path came up (not in the figures above), and the warm-up's median",
        ),
    ]


def slowest(page: Page) -> list[Block]:
    """Each configuration's slowest requests, linked to their trace files."""
    out: list[Block] = [Heading("Slowest requests' traces")]
    for name, t in page.report.targets.items():
        if not t.slowest:
            continue
        items = tuple(
            Note(f"{s.e2e_ms:.3f} ms · c={s.concurrency} round {s.round} · trace {s.trace_id or '–'}", href=s.file)
            for s in t.slowest
        )
        out += [Heading(name, level=3), Notes(items)]
    if len(out) == 1:
        return [*out, Paragraph("No traces were recorded (tracing off).")]
    return [
        *out,
        Paragraph("Open a trace file in Jaeger's UI (Search → Upload / JSON File), or run `pathprobe analyze FILE`."),
    ]


def problems(page: Page) -> list[Block]:
    """Configurations that failed or were skipped, and why."""
    bad = [(n, t) for n, t in page.report.targets.items() if t.problem]
    if not bad:
        return []
    return [
        Heading("Failed and skipped"),
        Notes(tuple(Note(f"{t.status}: {t.reason or ''}", subject=n) for n, t in bad)),
    ]


def method(page: Page) -> list[Block]:
    """How the figures were made, in full."""
    r = page.report
    return [
        Heading("Method"),
        Paragraph(f"baseline: {r.baseline}; {r.method.summary}"),
        Code(json.dumps(r.method.model_dump(mode="json"), indent=1)),
    ]


def files(page: Page) -> list[Block]:
    if not page.report.files:
        return []
    return [Paragraph("reports: " + ", ".join(f"{k}: {v}" for k, v in page.report.files.items()))]


#: the page, in order; a new section is one function added here
SECTIONS: tuple[Section, ...] = (
    header,
    lead_figure,
    scorecard,
    frontier,
    path_tax,
    propagation,
    concurrency,
    payload_sweep,
    figures,
    footnotes,
    cold_start,
    slowest,
    problems,
    method,
    files,
)


def build(report: Report, records: Records | None = None) -> list[Block]:
    """Every section's blocks, in page order."""
    page = Page(report, records or {})
    return [block for section in SECTIONS for block in section(page)]
