"""The dated scorecard's tables from compare reports (report.json): one scorecard row per
configuration (the unary and the streamed runs merged), the unary throughput frontier and the
streams frontier, as Markdown.

    python bench/scorecard_tables.py --unary A/report.json [B/report.json ...] \
        --stream C/report.json [D/report.json ...] [--streams E/report.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pathprobe.analysis.report.model import Estimate, FrontierSearch, Report, ScoreRow
from pathprobe.analysis.report.tables import knee_cell, load_text


def est(e: Estimate | None, digits: int = 2) -> str:
    if e is None or e.value is None:
        return "–"
    if e.lo is None or e.hi is None:
        return f"{e.value:.{digits}f}"
    return f"{e.value:.{digits}f} [{e.lo:.{digits}f}, {e.hi:.{digits}f}]"


def num(v: float | None, fmt: str = ".2f") -> str:
    return "–" if v is None else format(v, fmt)


def rows(paths: list[str]) -> dict[str, tuple[Report, ScoreRow]]:
    out: dict[str, tuple[Report, ScoreRow]] = {}
    for p in paths:
        report = Report.read(Path(p).read_text())
        for r in report.scorecard.rows if report.scorecard else []:
            out[r.target] = (report, r)
    return out


def saturated(report: Report, name: str) -> str:
    g = report.targets[name].at(min(report.concurrency))
    c = g.client if g is not None else None
    return "saturated" if c is not None and c.saturated else ("contended" if c is not None and c.contended else "ok")


def scorecard(unary: dict[str, tuple[Report, ScoreRow]], stream: dict[str, tuple[Report, ScoreRow]]) -> str:
    head = (
        "| config | vs | added p50 ms | added p99 ms | added TTFT p50 ms | added TTFT p99 ms | added gap p99 ms "
        "| buffering | CPU ms/req | RSS rest / load MB | client (unary / stream) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for name in list(dict.fromkeys([*unary, *stream])):
        u = unary.get(name)
        s = stream.get(name)
        ur, sr = (u[1] if u else None), (s[1] if s else None)
        any_row = ur or sr
        assert any_row is not None
        buf = "–" if sr is None or sr.buffering is None else ("BUFFERS" if sr.buffering else "streams through")
        cpu = ur.cpu_ms_per_request if ur else None
        rss = f"{num(any_row.rss_rest_mb, '.0f')} / {num(any_row.rss_load_mb, '.0f')}"
        health = f"{saturated(u[0], name) if u else '–'} / {saturated(s[0], name) if s else '–'}"
        lines.append(
            f"| {name} | {any_row.against} | {est(ur.added_p50 if ur else None)} | {est(ur.added_p99 if ur else None)} "
            f"| {est(sr.added_ttft_p50 if sr else None)} | {est(sr.added_ttft_p99 if sr else None)} "
            f"| {est(sr.added_gap_p99 if sr else None)} | {buf} | {num(cpu, '.3f')} | {rss} | {health} |"
        )
    return head + "\n".join(lines)


def _held(search: FrontierSearch) -> str:
    held = [k.load for k in search.knees if k.load is not None]
    at = search.at(max(held)) if held else None
    if at is None:
        return "– | –"
    return f"{num(at.cpu_ms_per_request, '.3f')} | {num(at.rss_mb, '.0f')}"


def frontier(paths: list[str]) -> str:
    out = []
    for p in paths:
        report = Report.read(Path(p).read_text())
        fr = report.frontier
        if fr is None:
            continue
        for name, t in fr.targets.items():
            for kind, s in (("rps", t.unary), ("streams", t.stream)):
                if s is None:
                    continue
                knees = " | ".join(f"+{k.bound_ms:g} ms: {knee_cell(k)}" for k in s.knees)
                steps = ", ".join(f"{load_text(q.load)}: {num(q.added_p99_ms, '+.1f')}" for q in s.points)
                refused = "; ".join(f"{load_text(q.load)} ({q.reason})" for q in s.refused) or "–"
                out.append(f"| {name} | {t.against} | {kind} | {knees} | {_held(s)} | {steps} | {refused} |")
    head = (
        "| config | vs | load | knee per bound (load that held) | CPU ms/req | RSS MB | steps (load: added p99 ms) "
        "| refused (client saturated) |\n|---|---|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unary", nargs="+", default=[])
    ap.add_argument("--stream", nargs="+", default=[])
    ap.add_argument("--streams", nargs="*", default=[])
    a = ap.parse_args()
    print(scorecard(rows(a.unary), rows(a.stream)))
    print()
    print(frontier([*a.unary, *a.streams]))


if __name__ == "__main__":
    main()
