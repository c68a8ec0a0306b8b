"""``pathprobe compare``: the whole job, from config to report files, as phases: check the
addresses, start the local processes (:mod:`~pathprobe.analysis.lab.stack`), bring every path up,
warm up and measure (:mod:`~pathprobe.analysis.lab.rounds`), attach the cross-checks
(:mod:`~pathprobe.analysis.lab.crosscheck`), build the report (each configuration's entry:
:mod:`~pathprobe.analysis.lab.reportbuild`; the comparisons and verdicts here) and write it
(:mod:`~pathprobe.analysis.lab.reportfiles`)."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from pathprobe.analysis.lab import limits, propagation
from pathprobe.analysis.lab.config import CompareConfig, TargetConfig
from pathprobe.analysis.lab.crosscheck import attach_traces, attach_witness, expected_services, trace_completeness
from pathprobe.analysis.lab.loadrun import RunResult, prepare_prompts
from pathprobe.analysis.lab.meta import now_iso, run_meta
from pathprobe.analysis.lab.paths import Path_
from pathprobe.analysis.lab.probes import normalize_address, wait_ready
from pathprobe.analysis.lab.procs import reachable, split_hostport
from pathprobe.analysis.lab.reportbuild import network_info, target_entry
from pathprobe.analysis.lab.reportfiles import write_reports
from pathprobe.analysis.lab.rounds import Rounds
from pathprobe.analysis.lab.stack import Stack
from pathprobe.analysis.report import paired as paired_mod
from pathprobe.analysis.report import scorecard
from pathprobe.analysis.report.figures import add_comparisons, client_warnings
from pathprobe.analysis.report.model import SCHEMA_VERSION, ClientHealth, Limit, PayloadSweep, Report, Verdict
from pathprobe.analysis.report.selfreport import add_self_reports
from pathprobe.errors import ConfigError

if TYPE_CHECKING:
    from pathprobe.analysis.lab.witness import Capture
    from pathprobe.analysis.report.records import TaggedRecord

__all__ = [  # with names that moved out of this module and are still imported from it
    "Interrupted",
    "attach_traces",
    "attach_witness",
    "build_report",
    "expected_services",
    "method_summary",
    "run_compare",
    "trace_completeness",
    "write_reports",
]


def log_stderr(msg: str) -> None:
    """compare's progress lines, time-stamped, on stderr."""
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def method_summary(cfg: CompareConfig, primary: str) -> dict[str, Any]:
    L = cfg.load
    return {
        "primary_metric": primary,
        "summary": (
            (
                f"{L.rounds} rounds x {L.duration_s:g} s per configuration and concurrency "
                f"({', '.join(map(str, L.concurrency))}), calls interleaved one by one (one load process, "
                f"a shuffled order of the configurations per cycle, verdicts on the paired path tax); "
                f"warm-up {L.warmup_s:g} s "
                if L.interleave == "call"
                else f"{L.rounds} interleaved rounds x {L.duration_s:g} s per configuration and concurrency "
                f"({', '.join(map(str, L.concurrency))}), order rotated per round; warm-up {L.warmup_s:g} s "
            )
            + f"per configuration excluded; {L.arrival} arrival"
            + (f" at {L.rate:g} req/s" if L.rate else "")
            + f"; {'stream' if L.stream else 'unary'}, {L.prompt_set} prompts of {L.prompt_tokens} tokens, "
            f"max_tokens {L.max_tokens}"
            + (
                f" (a payload sweep: every point runs like a concurrency; the figures below are the first "
                f"point's, {L.payloads[0].prompt_tokens}/{L.payloads[0].max_tokens}, the sweep's in 'payload')"
                if L.swept
                else ""
            )
            + f". p50/p95/p99 with 95% bootstrap CIs ({cfg.bootstrap} resamples); "
            + (
                f"verdicts on the paired path-tax difference: its 95% CI excludes 0, Wilcoxon signed-rank "
                f"(Holm) below alpha {cfg.alpha}, and its median is at least the minimum effect "
                f"max({cfg.min_effect_ms:g} ms, {cfg.min_effect_rel:.0%} of the baseline's path tax); "
                f"otherwise 'no clear difference'."
                if L.interleave == "call"
                else f"Welch's t-test vs the baseline, Holm-adjusted, alpha {cfg.alpha}; a verdict needs "
                f"significance and a non-negligible Cliff's delta (>= 0.147)."
            )
        ),
        "rounds": L.rounds,
        "interleave": L.interleave,
        "duration_s": L.duration_s,
        "warmup_s": L.warmup_s,
        "concurrency": L.concurrency,
        "arrival": L.arrival,
        "rate": L.rate,
        "stream": L.stream,
        "prompt_set": L.prompt_set,
        "prompt_tokens": L.prompt_tokens,
        "max_tokens": L.max_tokens,
        "alpha": cfg.alpha,
        "test": "Welch's t-test (scipy.stats.ttest_ind, equal_var=False) per request, "
        "Holm-Bonferroni across configurations",
        "effect_sizes": "Cliff's delta (magnitude: Romano et al.) and Cohen's d",
        "ci": f"percentile bootstrap, {cfg.bootstrap} resamples, 95%",
        "note": "requests inside one run are not independent (shared queue, machine noise); "
        "per-round medians are in report.json (targets.*.by_concurrency.*.rounds) to judge stability",
        "client_check": "every load process measures its own event-loop lag and CPU (summary.json 'client'); "
        "a run whose load generator was saturated (loop or process CPU >= 90% of a core, or "
        "busy loop lag p99 >= 5 ms) is named in a warning under its concurrency "
        "(targets.*.by_concurrency.*.client, client_warnings), and verdicts involving it are "
        "flagged: its own waiting is booked as network hop 1",
    }


def _prepare_out(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("runs", "traces", "logs", "nginx", "proxies"):
        shutil.rmtree(out / sub, ignore_errors=True)
    (out / "traces" / "client").mkdir(parents=True, exist_ok=True)


class Interrupted(Exception):
    pass


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(f"stopped by signal {signum}")


def run_compare(cfg: CompareConfig, *, log: Callable[[str], None] = log_stderr, html: bool = True) -> Report:
    """Run the matrix; every process started is ended on return, on error and on SIGTERM/SIGINT."""
    import signal
    import threading

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run_compare(cfg, log=log, html=html)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run_compare(cfg: CompareConfig, *, log: Callable[[str], None], html: bool) -> Report:
    """The phases in order: check, start, bring every path up, warm up, measure, collect, report."""
    out = Path(cfg.out)
    _prepare_out(out)
    started, t_start = now_iso(), time.monotonic()
    primary = "latency" if cfg.load.arrival != "closed" else "e2e"
    stack = Stack(cfg, out, log)
    capture: Capture | None = None
    try:
        _check_addresses(cfg)
        prompt_files = _prompts(cfg, out, log)
        stack.limits = limits.derive(cfg, list(prompt_files.values()))
        if cfg.mode == "local":
            log(stack.placement.describe())
            log(f"engine: {'in a process of its own' if stack.engine_process else 'in the server process'}")
            stack.check_ports()
            stack.start_server()
        paths = _bring_up(cfg, stack, log)
        live = _live(paths)
        propagation = _check_propagation(live, log)
        first = cfg.load.payloads[0].prompt_tokens
        prompt_file = prompt_files[first]
        rounds = Rounds(cfg, stack, live, primary, prompt_file, log, prompt_files)
        rounds.warm_up()
        capture = _start_capture(cfg, live, out, log)
        rounds.measure()
        if capture is not None:
            capture.stop()
        frontier = _frontier(cfg, stack, live, prompt_file, log)
        if cfg.tracing:
            time.sleep(1.5)  # servers and gateways export spans every 0.5 s
        server_startup = stack.server_startup_ms() if cfg.mode == "local" else None
    finally:
        if capture is not None:
            capture.stop()
        stack.close()
    every = rounds.results
    results = primary_runs(cfg, every)  # a payload sweep: the first point's runs (the sections as before)
    raw, samples = report_data(cfg, paths, results, rounds.warmups, primary, started, t_start)
    if cfg.load.swept:
        raw["payload"] = payload_block(cfg, every, stack.limits)
    if server_startup:
        raw["server_startup_ms"] = server_startup
    raw["meta"]["placement"] = {**stack.placement.as_dict(), "engine_process": stack.engine_process}
    for name, found in propagation.items():
        raw["targets"][name]["propagation"] = found
    if frontier is not None:
        raw["frontier"] = frontier
    _cross_check(cfg, raw, paths, results, capture, out, log)
    report = _typed(raw, samples, results, cfg.load.concurrency)  # the report, typed, built once
    write_reports(report, results, out, html, primary)
    return report


def _prompts(cfg: CompareConfig, out: Path, log: Callable[[str], None]) -> dict[int, Path | None]:
    """Each prompt size's prompt file, cut once before anything starts (the limits are sized from them)."""
    sizes = cfg.load.prompt_sizes
    if len(sizes) == 1:
        return {sizes[0]: prepare_prompts(cfg, out, log)}
    return {n: prepare_prompts(cfg, out, log, n) for n in sizes}


def primary_runs(cfg: CompareConfig, results: dict[str, list[RunResult]]) -> dict[str, list[RunResult]]:
    """The runs of the primary payload point (all runs when no payload is swept)."""
    first = cfg.load.payloads[0]
    return {name: [r for r in runs if r.payload in (None, first)] for name, runs in results.items()}


def payload_block(cfg: CompareConfig, results: dict[str, list[RunResult]], lim: limits.Limits | None) -> PayloadSweep:
    """The payload sweep's rows: every configuration, concurrency and point, rounds pooled."""
    from pathprobe.analysis.lab.reportbuild import hop_names
    from pathprobe.analysis.report.payload import payload_row

    rows = []
    for t in cfg.enabled_targets:
        runs = results.get(t.name, [])
        for conc in cfg.load.concurrency:
            for point in cfg.load.payloads:
                recs = [rec for r in runs if r.concurrency == conc and r.payload == point for rec in r.records]
                if recs:
                    rows.append(payload_row(t.name, conc, (point.prompt_tokens, point.max_tokens), recs, hop_names(t)))
    return PayloadSweep(
        points=[tuple(p) for p in cfg.load.payloads],
        primary=tuple(cfg.load.payloads[0]),
        rows=rows,
        limits=[Limit.model_validate(r) for r in lim.rows(cfg)] if lim is not None else [],
    )


def _frontier(
    cfg: CompareConfig, stack: Stack, live: list[Path_], prompt_file: Path | None, log: Callable[[str], None]
) -> dict[str, object] | None:
    """The throughput frontier phase (``frontier:`` in the config), after the measured rounds."""
    if cfg.frontier is None:
        return None
    from pathprobe.analysis.lab.frontierrun import FrontierRun

    ok = [p for p in live if p.status == "ok"]
    return FrontierRun(cfg, stack.out, stack.placement, prompt_file, log).run(ok)


def _records_by_concurrency(
    results: dict[str, list[RunResult]], concs: list[int]
) -> dict[str, dict[int, list[TaggedRecord]]]:
    return {
        name: {c: [rec for r in runs if r.concurrency == c for rec in r.records] for c in concs}
        for name, runs in results.items()
    }


def _check_propagation(live: list[Path_], log: Callable[[str], None]) -> dict[str, dict[str, object]]:
    """Before any load: one request per traced path with a traceparent of our own, each hop judged
    (:mod:`pathprobe.analysis.lab.propagation`)."""
    out: dict[str, dict[str, object]] = {}
    for p in live:
        if p.server_spans is None:
            continue
        hops = [propagation.HopSpec(label, spans) for label, spans in p.trace_hops]
        found = propagation.check(p.url, hops, propagation.HopSpec("server", p.server_spans), headers=p.headers)
        out[p.name] = found.as_dict()
        verdicts = ", ".join(f"{h.label}: {h.verdict}" for h in found.hops) or found.error
        log(f"{p.name}: trace propagation {'holds' if found.holds else 'BREAKS'} ({verdicts})")
    return out


def _check_addresses(cfg: CompareConfig) -> None:
    """Early failure on an address that does not answer (remote mode, external targets)."""
    for t in cfg.enabled_targets:
        if cfg.mode == "remote" or t.kind == "external":
            host, port = split_hostport(t.address or "")
            why = reachable(f"{host}:{port}")
            if why:
                raise ConfigError(f"targets[{cfg.targets.index(t)}] '{t.name}': {t.address} is unreachable: {why}")


def _bring_up(cfg: CompareConfig, stack: Stack, log: Callable[[str], None]) -> dict[str, Path_]:
    """Every configuration's path, started (local mode) and probed with a real request."""
    paths: dict[str, Path_] = {}
    for t in cfg.enabled_targets:
        p = _remote_path(cfg, stack, t) if cfg.mode == "remote" else stack.build(t)
        paths[t.name] = p
        log(
            f"{t.name}: {p.status}"
            + (f" ({p.reason})" if p.reason else f" at {p.url}, first request {p.probe_ms or 0.0:.1f} ms")
        )
    return paths


def _remote_path(cfg: CompareConfig, stack: Stack, t: TargetConfig) -> Path_:
    """A remote target's path: its address (behind a delaying relay when a condition is on), probed."""
    net = cfg.network_for(t)
    p = Path_(t, url=normalize_address(t.address or "", t.protocol or "grpc"))
    try:
        if net:
            front, m = stack.relay(t.name, "{}:{}".format(*split_hostport(t.address or "")), net)
            p.procs.append(m)
            p.url = normalize_address(front, t.protocol or "grpc")
        p.probe_ms = wait_ready(p.url, 30, p.procs, t.model)
        p.status = "ok"
    except Exception as exc:
        p.status, p.reason = "failed", f"did not answer: {getattr(exc, 'message', exc)}"
    return p


def _live(paths: dict[str, Path_]) -> list[Path_]:
    live = [p for p in paths.values() if p.status == "ok"]
    if not live:
        raise ConfigError(
            "no configuration could be started: " + "; ".join(f"{p.name}: {p.reason}" for p in paths.values())
        )
    return live


def _start_capture(cfg: CompareConfig, live: list[Path_], out: Path, log: Callable[[str], None]) -> Capture | None:
    """The wire witness's packet capture on every port the live paths use (``witness: pcap``)."""
    if cfg.witness != "pcap":
        return None
    if cfg.mode != "local":
        raise ConfigError("witness: pcap needs local mode (the capture follows the ports compare started)")
    if 1 not in cfg.load.concurrency and not cfg.tracing:
        raise ConfigError(
            "witness: pcap matches packets to requests by time at concurrency 1, and by trace id (tracing: "
            "true) at any concurrency; add 1 to load.concurrency or turn tracing on"
        )
    from pathprobe.analysis.lab.witness import Capture

    ports = [port for p in live for ports_, _ in p.chain for port in ports_]
    capture = Capture(out / "witness" / "capture.pcap", ports, payloads=cfg.tracing).start()
    log(f"witness: capturing {len(set(ports))} loopback ports into {capture.path}")
    return capture


def _cross_check(
    cfg: CompareConfig,
    report: dict[str, Any],
    paths: dict[str, Path_],
    results: dict[str, list[RunResult]],
    capture: Capture | None,
    out: Path,
    log: Callable[[str], None],
) -> None:
    """Attach the wire witness and the traces to the report (neither may lose the report)."""
    if capture is not None:
        attach_witness(report, paths, results, capture.path, log)
    if cfg.tracing:
        try:
            attach_traces(cfg, report, results, out, log)
        except Exception as exc:  # traces are a bonus; never lose the report for them
            report["traces_error"] = f"{type(exc).__name__}: {exc}"
            log(f"traces: {report['traces_error']}")


def build_report(
    cfg: CompareConfig,
    paths: dict[str, Path_],
    results: dict[str, list[RunResult]],
    warmups: dict[str, RunResult],
    primary: str,
    started: str,
    t_start: float,
) -> Report:
    """The typed report of these runs (what ``report.json`` holds), with the samples its plots draw; a
    payload sweep's runs of every point in ``payload`` (without its limits: the run set those)."""
    first = primary_runs(cfg, results)
    raw, samples = report_data(cfg, paths, first, warmups, primary, started, t_start)
    if cfg.load.swept:
        raw["payload"] = payload_block(cfg, results, None)
    return _typed(raw, samples, first, cfg.load.concurrency)


def _typed(
    raw: dict[str, Any],
    samples: dict[str, dict[int, list[float]]],
    results: dict[str, list[RunResult]],
    concs: list[int],
) -> Report:
    """The report validated into its model, with the scorecard made from the runs' records."""
    report = Report.model_validate(raw).with_samples(samples)
    report.scorecard = scorecard.build(report, _records_by_concurrency(results, concs))
    return report


def report_data(
    cfg: CompareConfig,
    paths: dict[str, Path_],
    results: dict[str, list[RunResult]],
    warmups: dict[str, RunResult],
    primary: str,
    started: str,
    t_start: float,
) -> tuple[dict[str, Any], dict[str, dict[int, list[float]]]]:
    """The report's content as it is assembled (the cross-checks still add to it), and each
    configuration's primary-metric samples per concurrency."""
    concs = cfg.load.concurrency
    report_targets: dict[str, Any] = {}
    samples: dict[str, dict[int, list[float]]] = {}
    for t in cfg.enabled_targets:
        p = paths.get(t.name) or Path_(t, status="failed", reason="not started")
        report_targets[t.name], samples[t.name] = target_entry(
            cfg, t, p, warmups.get(t.name), results.get(t.name, []), primary
        )
    baseline = cfg.baseline_name
    verdicts = add_comparisons(report_targets, samples, baseline, concs, primary, cfg.alpha)
    e2e_verdicts = None
    interleaved = any(paired_mod.is_interleaved(r.records) for runs in results.values() for r in runs)
    if interleaved:
        e2e_verdicts, verdicts = verdicts, _paired_verdicts(cfg, report_targets, results, baseline, concs)
    warnings = client_warnings(report_targets, concs)
    by_conc = {
        name: {c: [rec for r in runs if r.concurrency == c for rec in r.records] for c in concs}
        for name, runs in results.items()
    }
    self_reports = add_self_reports(report_targets, by_conc, baseline)
    return {
        "schema_version": SCHEMA_VERSION,
        "meta": run_meta(cfg, started, t_start),
        "baseline": baseline,
        "concurrency": concs,
        "method": method_summary(cfg, primary),
        "network": network_info(cfg.network if cfg.network and cfg.network.active else None),
        "targets": report_targets,
        "verdicts": verdicts,
        "e2e_verdicts": e2e_verdicts,
        "interleaved": interleaved,
        "client_warnings": warnings,
        "self_reports": self_reports,
    }, samples


def _paired_verdicts(
    cfg: CompareConfig,
    report_targets: dict[str, Any],
    results: dict[str, list[RunResult]],
    baseline: str,
    concs: list[int],
) -> list[Verdict]:
    """Interleaved runs: each configuration's path tax, its calls paired with the baseline's of the same
    cycle, and verdicts on the paired path-tax difference (see :mod:`pathprobe.analysis.report.paired`)."""
    verdicts: list[Verdict] = []
    against = paired_mod.partners(report_targets, baseline, explicit=cfg.baseline is not None)
    for conc in concs:
        recs = {
            name: [rec for r in runs if r.concurrency == conc for rec in r.records] for name, runs in results.items()
        }
        per: dict[str, dict[str, Any]] = {}
        for name, t in report_targets.items():
            g = t["by_concurrency"].get(str(conc))
            if g is None:
                continue
            g["path_tax"] = paired_mod.tax_summary(recs.get(name, []))
            if name in against and recs.get(partner := against[name]):
                got = paired_mod.paired(recs.get(name, []), recs[partner], n_boot=cfg.bootstrap)
                per[name] = g["paired"] = {**got, "against": partner}
        found = paired_mod.judge(per, baseline, conc, cfg.alpha, min_ms=cfg.min_effect_ms, min_rel=cfg.min_effect_rel)
        saturated = [
            name
            for name, t in report_targets.items()
            if isinstance(c := (t["by_concurrency"].get(str(conc)) or {}).get("client"), ClientHealth) and c.saturated
        ]
        for v in found:
            # the load generator's own work (not the machine's other processes: a contended run is said
            # once for the whole run, and both calls of a pair saw it) is in hop 1 of the pair's calls
            if saturated:
                v["client_flag"] = "client saturated"
                v["client_saturated"] = saturated
                v["text"] += (
                    " -- FLAGGED: client saturated at this concurrency (the load generator's own work delayed "
                    "its event loop): the path tax includes that waiting, and another run may differ"
                )
        verdicts += [Verdict.model_validate(v) for v in found]
    return verdicts
