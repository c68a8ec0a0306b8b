"""``pathprobe compare --rerender``: a finished compare's reports rebuilt from its ``runs/`` folder,
without running anything (e.g. with another baseline or alpha)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pathprobe.analysis.lab.compare import build_report, log_stderr, primary_runs
from pathprobe.analysis.lab.config import CompareConfig, Payload, TargetConfig
from pathprobe.analysis.lab.loadrun import RunResult, read_accounting, read_client, read_path_cpu, run_subdir
from pathprobe.analysis.lab.paths import Path_
from pathprobe.analysis.lab.reportfiles import write_reports
from pathprobe.analysis.report import scorecard
from pathprobe.analysis.report.model import Report, Target
from pathprobe.errors import ConfigError
from pydantic import ValidationError


def rerender(
    out: Path,
    *,
    baseline: str | None = None,
    alpha: float | None = None,
    html: bool = True,
    log: Callable[[str], None] = log_stderr,
) -> Report:
    """Rebuild the reports of a finished compare from its ``runs/`` folder, without running anything
    (e.g. with another baseline or alpha). Statuses, reasons and cold starts come from the old report.json."""
    old_path = out / "report.json"
    old = read_report(old_path)
    data = dict(old.meta.config)
    if baseline is not None:
        data["baseline"] = baseline
    if alpha is not None:
        data["alpha"] = alpha
    from pathprobe.analysis.lab.config import parse_config

    cfg = parse_config(data, str(old_path))
    paths: dict[str, Path_] = {}
    results: dict[str, list[RunResult]] = {}
    for t in cfg.enabled_targets:
        prev = old.targets.get(t.name) or Target(status="failed")
        paths[t.name] = previous_path(t, prev)
        results[t.name] = read_runs(cfg, t, prev, out)
    report = build_report(cfg, paths, results, {}, old.primary, old.meta.started, time.monotonic())
    for name, t_new in report.targets.items():  # kept from the run: cold starts, traces, trace checks
        prev_t = old.targets.get(name)
        if prev_t is None:
            continue
        for key in ("cold_start", "slowest", "trace_agreement"):
            if key in prev_t.model_fields_set:
                setattr(t_new, key, getattr(prev_t, key))
    if report.payload is not None and old.payload is not None:
        report.payload.limits = old.payload.limits  # what the run set (sized from its cut prompts)
    if old.frontier is not None:  # the frontier's steps are not under runs/: kept as measured
        report.frontier = old.frontier
        scorecard.add_frontier(report.scorecard, report)
    # where, when and on what the run was (placement, load average): the run's, not this machine's now
    report.meta = old.meta.model_copy(update={"config": report.meta.config, "rerendered_from": str(old_path)})
    write_reports(report, primary_runs(cfg, results), out, html, old.primary)
    log(f"re-rendered {out} with baseline {report.baseline}")
    return report


def read_report(path: Path) -> Report:
    """A finished compare's report.json, read back through the model."""
    try:
        return Report.read(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        raise ConfigError(f"{path}: not a compare report ({exc})") from None


def previous_path(t: TargetConfig, prev: Target) -> Path_:
    """A configuration's path as the run left it: status, reason, notes, TLS handshake, probe time."""
    p = Path_(t, url=prev.url, status=prev.status, reason=prev.reason or "")
    p.notes = list(prev.notes)
    p.tls_handshake = prev.tls_handshake
    p.probe_ms = prev.cold_start.probe_ms if prev.cold_start is not None else None
    if prev.memory is not None:
        p.rss_rest = _bytes(prev.memory.rest_mb)
        p.rss_load = _bytes(prev.memory.load_mb)
    return p


def _bytes(mb: float | None) -> int | None:
    return None if mb is None else round(mb * 2**20)


def read_runs(cfg: CompareConfig, t: TargetConfig, prev: Target, out: Path) -> list[RunResult]:
    """A configuration's runs read back from ``runs/NAME/cC/rR`` (records, client, CPU, accounting)."""
    runs = []
    points: list[Payload | None] = list(cfg.load.payloads) if cfg.load.swept else [None]
    for conc in cfg.load.concurrency:
        for point in points:
            for rnd in range(cfg.load.rounds):
                d = out / "runs" / t.name / run_subdir(conc, point) / f"r{rnd}"
                if (d / "records.jsonl").exists():
                    runs.append(read_run(cfg, t, prev, out, conc, rnd, d))
                    runs[-1].payload = point
    return runs


def read_run(cfg: CompareConfig, t: TargetConfig, prev: Target, out: Path, conc: int, rnd: int, d: Path) -> RunResult:
    from pathprobe.analysis.report.records import read_tagged

    recs = read_tagged(d / "records.jsonl", _round=rnd, _concurrency=conc)
    group = prev.at(conc)
    dur = group.duration_s if group is not None else None
    n_runs = max(1, len(list(d.parent.glob("r*"))))  # the rounds of this concurrency (and payload point)
    per_run = dur / n_runs if dur else cfg.load.duration_s
    return RunResult(
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
