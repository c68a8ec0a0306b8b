"""The report's notes as :class:`~pathprobe.analysis.report.blocks.Note` items: what to know beside
the tables (accounting, streamed chunks, missing server timing, the paths' CPU, verdicts, traces)."""

from __future__ import annotations

from pathprobe.analysis.report.blocks import Note
from pathprobe.analysis.report.figures import path_tax_rows
from pathprobe.analysis.report.model import Accounting, Report, TraceCheck


def _accounting_warning(name: str, acct: Accounting) -> Note | None:
    if acct.error:
        return Note(f"accounting for {name}: {acct.error}", "WARNING", "warning")
    bad = [d for d in acct.differences if not d.explained]
    if not bad and not acct.lost:
        return None
    text = "; ".join(f"{d.why} ({d.status})" for d in bad[:4])
    return Note(
        f"accounting for {name}: {acct.lost or 0} request(s) lost, {len(bad)} unexplained difference(s): {text}",
        "WARNING",
        "warning",
    )


def accounting_notes(r: Report, conc: int) -> list[Note]:
    """One WARNING per configuration whose hops did not count what the client sent; else one line."""
    out, clean, n = [], [], 0
    for name, t in r.targets.items():
        g = t.at(conc)
        if g is None or g.accounting is None:
            continue
        warning = _accounting_warning(name, g.accounting)
        if warning is not None:
            out.append(warning)
            continue
        n += sum(g.accounting.client.values())
        clean.append(name)
    if clean:
        out.append(
            Note(
                f"accounting: every request of {', '.join(clean)} counted at each hop by status "
                f"({n} requests; in-flight-at-stop differences explained)"
            )
        )
    return out


def group_warnings(r: Report, conc: int) -> list[Note]:
    """A proxy that coalesced streamed chunks; ok answers without the server's timing."""
    out = []
    for name, t in r.targets.items():
        g = t.at(conc)
        if g is None:
            continue
        if g.chunks is not None and g.chunks.buffering:
            out.append(
                Note(
                    f"{name} buffers or coalesces streamed chunks: in {g.chunks.buffered_streams} of "
                    f"{g.chunks.streams} streams, chunks the server emitted apart arrived together "
                    "(inter-token gaps measure the proxy, not the engine)",
                    "warning",
                    "warning",
                )
            )
        if g.ok_without_server_timing:
            out.append(
                Note(
                    f"{name}: {g.ok_without_server_timing} of {g.ok} ok answers carried no srv.* timing "
                    "(no server-timing trailer/header): their server time is in network",
                    "warning",
                    "warning",
                )
            )
    return out


def cpu_note(r: Report, conc: int) -> list[Note]:
    cpu = [(n, g.path_cpu) for n, t in r.targets.items() if (g := t.at(conc)) is not None and g.path_cpu]
    if not cpu:
        return []
    return [
        Note(
            "CPU per request of each path's own processes (gateway / proxy, not the server): "
            + ", ".join(f"{n} {c.ms_per_request:.3f} ms" for n, c in cpu)
        )
    ]


def verdict_notes(r: Report, conc: int) -> list[Note]:
    """The verdicts at one concurrency, what did not differ clearly, or that nothing differed."""
    verdicts = [v for v in r.verdicts if v.concurrency == conc]
    out = [Note(v.text, "verdict", "verdict", flag=v.client_flag or None) for v in verdicts]
    unclear = [row for row in path_tax_rows(r, conc) if row.verdict == "no clear difference"]
    if unclear:
        out.append(
            Note(
                "no clear difference in path tax: "
                + "; ".join(f"{row.config} vs {row.against} ({row.why})" for row in unclear)
            )
        )
    if not verdicts:
        out.append(Note("no configuration differs significantly from its partner at this concurrency"))
    return out


def _unseen_text(a: TraceCheck) -> str:
    """What a trace cannot check on a path with a hop that exports no spans, said as expected."""
    if not a.unseen_hops:
        return ""
    return (
        f" ({', '.join(a.unseen_hops)} exports no spans, as expected: it reports its time in-band only, so a trace "
        f"sees its links and its own time as one stretch: {' + '.join(a.together)} compared as one sum"
        + (f", {' / '.join(a.skipped)} not compared" if a.skipped else "")
        + ")"
    )


def trace_notes(r: Report) -> list[Note]:
    """The trace check (the split from spans against the in-band one) and trace completeness."""
    out = []
    checks = [(n, a) for n, t in r.targets.items() if t.trace_agreement and (a := t.trace_agreement.get("attributes"))]
    if checks:
        parts = []
        for n, a in checks:
            bad = {k: v for k, v in a.outside.items() if v}
            parts.append(
                f"{n} {a.matched} traces "
                + ("agree" if not bad else "differ on " + ", ".join(f"{k} ({v})" for k, v in bad.items()))
                + _unseen_text(a)
            )
        out.append(
            Note(
                "trace check (`pathprobe analyze` on this run's spans vs the in-band split, max(5%, 0.2 ms)): "
                + "; ".join(parts)
            )
        )
    comp = [(n, c) for n, t in r.targets.items() if (c := t.trace_completeness) is not None and c.requests]
    if comp:
        out.append(
            Note(
                "trace completeness (ok requests whose trace has every expected span): "
                + "; ".join(
                    f"{n} {c.share or 0:.1%}"
                    + (" (missing: " + ", ".join(f"{k} {v}" for k, v in c.missing.items()) + ")" if c.missing else "")
                    for n, c in comp
                )
            )
        )
    return out
