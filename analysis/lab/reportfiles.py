"""A compare's report files: ``report.json`` (the typed report itself), ``report.html`` (plots,
tables) and ``report.md``."""

from __future__ import annotations

from pathlib import Path

from pathprobe.analysis.lab.loadrun import RunResult
from pathprobe.analysis.report.markdown import markdown
from pathprobe.analysis.report.model import Report
from pathprobe.analysis.report.records import TaggedRecord


def write_reports(report: Report, results: dict[str, list[RunResult]], out: Path, html: bool, primary: str) -> None:
    """Write the three files (``primary``: kept for callers; the report names its own metric)."""
    from pathprobe.analysis.report.html import render

    files = {"json": str(out / "report.json")}
    if html:
        files["html"] = str(out / "report.html")
    report.files = files
    (out / "report.json").write_text(report.to_json(), encoding="utf-8")
    if html:
        render(report, records_by_concurrency(results), out / "report.html")
    (out / "report.md").write_text(markdown(report) + "\n", encoding="utf-8")


def records_by_concurrency(results: dict[str, list[RunResult]]) -> dict[str, dict[int, list[TaggedRecord]]]:
    """Each configuration's records per concurrency, rounds pooled (the waterfall and streaming plots)."""
    records: dict[str, dict[int, list[TaggedRecord]]] = {name: {} for name in results}
    for name, runs in results.items():
        for run in runs:
            records[name].setdefault(run.concurrency, []).extend(run.records)
    return records
