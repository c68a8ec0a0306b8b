"""``pathprobe compare --rerender``: a finished compare's reports rebuilt from its ``runs/`` folder,
without running anything (e.g. with another baseline or alpha)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pathprobe.analysis.lab.compare import build_report, log_stderr
from pathprobe.analysis.lab.loadrun import RunResult, read_accounting, read_client, read_path_cpu
from pathprobe.analysis.lab.paths import Path_
from pathprobe.analysis.lab.reportfiles import write_reports
from pathprobe.errors import ConfigError


def rerender(
    out: Path,
    *,
    baseline: str | None = None,
    alpha: float | None = None,
    html: bool = True,
    log: Callable[[str], None] = log_stderr,
) -> dict[str, Any]:
    """Rebuild the reports of a finished compare from its ``runs/`` folder, without running anything
    (e.g. with another baseline or alpha). Statuses, reasons and cold starts come from the old report.json."""
    from pathprobe.analysis.report.records import read_tagged

    old_path = out / "report.json"
    try:
        old = json.loads(old_path.read_text(encoding="utf-8"))
        data = old["meta"]["config"]
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"{old_path}: not a compare report ({exc})") from None
    if baseline is not None:
        data["baseline"] = baseline
    if alpha is not None:
        data["alpha"] = alpha
    from pathprobe.analysis.lab.config import parse_config

    cfg = parse_config(data, str(old_path))
    primary = old["method"]["primary_metric"]
    paths: dict[str, Path_] = {}
    results: dict[str, list[RunResult]] = {}
    for t in cfg.enabled_targets:
        prev = old["targets"].get(t.name, {})
        p = Path_(t, url=prev.get("url", ""), status=prev.get("status", "failed"), reason=prev.get("reason", ""))
        p.notes = prev.get("notes", [])
        p.tls_handshake = prev.get("tls_handshake")
        p.probe_ms = (prev.get("cold_start") or {}).get("probe_ms")
        paths[t.name] = p
        runs = []
        for conc in cfg.load.concurrency:
            for rnd in range(cfg.load.rounds):
                d = out / "runs" / t.name / f"c{conc}" / f"r{rnd}"
                if (d / "records.jsonl").exists():
                    recs = read_tagged(d / "records.jsonl", _round=rnd, _concurrency=conc)
                    dur = prev.get("by_concurrency", {}).get(str(conc), {}).get("duration_s")
                    per_run = (
                        dur / max(1, len([x for x in (out / "runs" / t.name / f"c{conc}").glob("r*")]))
                        if dur
                        else cfg.load.duration_s
                    )
                    runs.append(
                        RunResult(
                            t.name,
                            conc,
                            rnd,
                            d,
                            recs,
                            per_run,
                            client=read_client(d),
                            path_cpu_s=read_path_cpu(d),
                            accounting=read_accounting(d),
                        )
                    )
        results[t.name] = runs
    report = build_report(cfg, paths, results, {}, primary, old["meta"].get("started", ""), time.monotonic())
    for name, t in report["targets"].items():  # kept from the run: cold starts, traces, trace checks
        prev = old["targets"].get(name, {})
        for key in ("cold_start", "slowest", "trace_agreement"):
            if key in prev:
                t[key] = prev[key]
    report["meta"]["rerendered_from"] = str(old_path)
    write_reports(report, results, out, html, primary)
    log(f"re-rendered {out} with baseline {report['baseline']}")
    return report
