"""The report's notes as :class:`~pathprobe.analysis.report.blocks.Note` items: what to know beside
the tables (accounting, streamed chunks, missing server timing, the paths' CPU, verdicts, traces)."""

from __future__ import annotations

from pathprobe.analysis.report.blocks import Note
from pathprobe.analysis.report.figures import path_tax_rows
from pathprobe.analysis.report.model import Accounting, ClientHealth, Group, Report, TraceCheck


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


def _worst(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return max(got) if got else None


def run_note(r: Report) -> Note | None:
    """Said once for the whole run: the machine was busy (its load average), and where the load
    generator's event loop waited for a core that other processes held. Both calls of a pair saw that
    moment, so paired figures cancel most of it; absolute times carry it."""
    contended = [
        (conc, c) for conc in r.concurrency for t in r.targets.values() if (c := _client(t.at(conc))) and c.contended
    ]
    load = r.meta.load_average
    busy_box = load is not None and r.meta.cpus is not None and load[0] > r.meta.cpus
    if not contended and not busy_box:
        return None
    text = "the machine was busy"
    if load is not None:
        text += (
            f" (load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} over 1 / 5 / 15 min on {r.meta.cpus} cores)"
        )
    if contended:
        concs = sorted({conc for conc, _ in contended})
        lag = _worst([c.loop_lag_ms.get("p99") for _, c in contended])
        wait = _worst([c.loop_wait_lag_ms.get("p99") for _, c in contended])
        cpu = _worst([c.cpu_percent.get("mean") for _, c in contended])
        text += (
            f": the load generator's event loop waited for a core at concurrency {', '.join(map(str, concs))} "
            f"(lag p99 up to {lag or 0:.1f} ms"
            + (f", {wait:.1f} ms of it runnable without a core" if wait is not None else "")
            + f", the loop itself at {cpu or 0:.0f}% of one core: other processes, not its own load)"
        )
    text += (
        "; network hop 1 holds that waiting in both calls of each pair, so paired figures cancel most of it, "
        "absolute times do not"
    )
    return Note(text, "note", "client-note")


def _client(g: Group | None) -> ClientHealth | None:
    return g.client if g is not None else None
