"""A compare's report files: ``report.json``, ``report.html`` (plots, tables) and ``report.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pathprobe.analysis.lab.loadrun import RunResult
from pathprobe.analysis.report.markdown import markdown


def write_reports(
    report: dict[str, Any], results: dict[str, list[RunResult]], out: Path, html: bool, primary: str
) -> None:
    from pathprobe.analysis.report.html import json_safe, render

    samples = report.pop("_samples", {})
    report["files"] = {"json": str(out / "report.json")}
    if html:
        report["files"]["html"] = str(out / "report.html")
    (out / "report.json").write_text(json.dumps(json_safe(report), indent=1), encoding="utf-8")
    if html:
        records: dict[str, dict[int, list[dict[str, Any]]]] = {name: {} for name in results}
        for name, runs in results.items():
            for run in runs:
                records[name].setdefault(run.concurrency, []).extend(run.records)
        render(report, samples, records, out / "report.html")
    (out / "report.md").write_text(markdown(report) + "\n", encoding="utf-8")
