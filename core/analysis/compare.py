"""``pathprobe compare``: the whole job, from config to report files."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pathprobe.analysis import paired as paired_mod
from pathprobe.analysis.accounting import merge as accounting_merge
from pathprobe.analysis.config import CompareConfig, TargetConfig
from pathprobe.analysis.hops import summarize_hops
from pathprobe.analysis.report import (
    add_comparisons,
    client_summary,
    client_warnings,
    markdown,
    metric_values,
    summarize_group,
)
from pathprobe.analysis.runner import (
    Path_,
    RunResult,
    Stack,
    cpu_seconds,
    expected_shift_ms,
    interleavable,
    normalize_address,
    now_iso,
    prepare_prompts,
    reachable,
    read_accounting,
    read_client,
    run_load,
    run_load_mixed,
    split_hostport,
    versions,
    wait_ready,
)
from pathprobe.analysis.selfreport import add_self_reports
from pathprobe.errors import ConfigError
from pathprobe.serverreports import VLLM_SPAN


def _stderr(msg: str) -> None:
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
            f"max_tokens {L.max_tokens}. p50/p95/p99 with 95% bootstrap CIs ({cfg.bootstrap} resamples); "
            f"Welch's t-test vs the baseline, Holm-adjusted, alpha {cfg.alpha}; a verdict needs "
            f"significance and a non-negligible Cliff's delta (>= 0.147)."
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


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Interrupted(f"stopped by signal {signum}")


def run_compare(cfg: CompareConfig, *, log: Callable[[str], None] = _stderr, html: bool = True) -> dict[str, Any]:
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


def _run_compare(cfg: CompareConfig, *, log: Callable[[str], None], html: bool) -> dict[str, Any]:
    out = Path(cfg.out)
    _prepare_out(out)
    started = now_iso()
    t_start = time.monotonic()
    targets = cfg.enabled_targets
    stack = Stack(cfg, out, log)
    paths: dict[str, Path_] = {}
    primary = "latency" if cfg.load.arrival != "closed" else "e2e"
    results: dict[str, list[RunResult]] = {t.name: [] for t in targets}
    warmups: dict[str, RunResult] = {}
    capture = None
    try:
        # ---- early failures: bad addresses, taken ports
        for t in targets:
            if cfg.mode == "remote" or t.kind == "external":
                host, port = split_hostport(t.address or "")
                why = reachable(f"{host}:{port}")
                if why:
                    raise ConfigError(f"targets[{cfg.targets.index(t)}] '{t.name}': {t.address} is unreachable: {why}")
        if cfg.mode == "local":
            log(stack.placement.describe())
            stack.check_ports()
            stack.start_server()
        # ---- bring every path up and probe it with a real request
        for t in targets:
            net = cfg.network_for(t)
            if cfg.mode == "remote":
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
            else:
                p = stack.build(t)
            paths[t.name] = p
            log(
                f"{t.name}: {p.status}"
                + (f" ({p.reason})" if p.reason else f" at {p.url}, first request {p.probe_ms:.1f} ms")
            )
        live = [p for p in paths.values() if p.status == "ok"]
        if not live:
            raise ConfigError(
                "no configuration could be started: " + "; ".join(f"{p.name}: {p.reason}" for p in paths.values())
            )
        traces_dir = out / "traces" / "client"
        prompt_file = prepare_prompts(cfg, out, log)
        mixed = interleavable(cfg, live)
        # ---- warm-up per configuration (interleaved call by call when the rounds are)
        if cfg.load.warmup_s > 0:
            if mixed:
                warm = run_load_mixed(
                    cfg,
                    live,
                    max(cfg.load.concurrency),
                    -1,
                    cfg.load.warmup_s,
                    out / "runs",
                    None,
                    prompt_file,
                    stack.placement,
                )
            else:
                warm = {
                    p.name: run_load(
                        cfg,
                        p,
                        max(cfg.load.concurrency),
                        -1,
                        cfg.load.warmup_s,
                        out / "runs" / p.name / "warmup",
                        None,
                        prompt_file,
                        stack.placement,
                    )
                    for p in live
                }
            for p in live:
                res = warm[p.name]
                warmups[p.name] = res
                ok = [r for r in res.records if r.get("ok")]
                if res.error or not ok:
                    _fail(p, f"warm-up: {res.error or _first_error(res.records)}")
                log(f"warm-up {p.name}: {len(ok)} ok of {len(res.records)}")
        if cfg.witness == "pcap":
            if cfg.mode != "local":
                raise ConfigError("witness: pcap needs local mode (the capture follows the ports compare started)")
            if 1 not in cfg.load.concurrency:
                raise ConfigError(
                    "witness: pcap matches packets to requests at concurrency 1; add 1 to load.concurrency"
                )
            from pathprobe.analysis.witness import Capture

            ports = [port for p in live for ports_, _ in p.chain for port in ports_]
            capture = Capture(out / "witness" / "capture.pcap", ports).start()
            log(f"witness: capturing {len(set(ports))} loopback ports into {capture.path}")
        # ---- measured rounds, interleaved
        n_runs = cfg.load.rounds * len(cfg.load.concurrency)
        k = 0
        for rnd in range(cfg.load.rounds):
            for ci, conc in enumerate(cfg.load.concurrency):
                k += 1
                order = [p for p in live if p.status == "ok"]
                if not order:
                    break
                shift = (rnd + ci) % len(order)
                order = order[shift:] + order[:shift]
                for p in order:
                    dead = p.dead() or (stack.server if stack.server and stack.server.exit_code() is not None else None)
                    if dead is not None:
                        _fail(
                            p, f"{dead.name} exited with code {dead.exit_code()} before round {rnd + 1}: {dead.tail()}"
                        )
                order = [p for p in order if p.status == "ok"]
                # CPU of each path's own processes (they serve only its requests, interleaved or not)
                cpu0 = {p.name: cpu_seconds(p.procs) for p in order}
                if mixed and len(order) > 1:
                    tf = traces_dir / f"interleaved-c{conc}-r{rnd}.jsonl" if cfg.tracing else None
                    before_batch = {p.name: _scrape(stack, p) for p in order}
                    batch = run_load_mixed(
                        cfg, order, conc, rnd, cfg.load.duration_s, out / "runs", tf, prompt_file, stack.placement
                    )
                    _account_batch(stack, order, before_batch, batch)
                else:
                    batch = {}
                for p in order:
                    if p.name in batch:
                        res = batch[p.name]
                    else:
                        tf = traces_dir / f"{p.name}-c{conc}-r{rnd}.jsonl" if cfg.tracing else None
                        cpu0[p.name] = cpu_seconds(p.procs)
                        run_dir = out / "runs" / p.name / f"c{conc}" / f"r{rnd}"
                        before = _scrape(stack, p)  # accounting: one path per run, so its counters are its own
                        res = run_load(
                            cfg, p, conc, rnd, cfg.load.duration_s, run_dir, tf, prompt_file, stack.placement
                        )
                        res.accounting = _account(stack, p, before, res, run_dir)
                    cpu1 = cpu_seconds(p.procs)
                    if cpu0[p.name] is not None and cpu1 is not None:
                        res.path_cpu_s = cpu1 - cpu0[p.name]
                        (res.out_dir / "path_cpu.json").write_text(json.dumps({"cpu_s": res.path_cpu_s}))
                    results[p.name].append(res)
                    ok = [r for r in res.records if r.get("ok")]
                    failed = [r for r in res.records if not r.get("ok") and r.get("status") != "STOPPED"]
                    dead = p.dead()
                    if dead is not None:
                        _fail(
                            p,
                            f"{dead.name} exited with code {dead.exit_code()} during round {rnd + 1}, "
                            f"concurrency {conc}: {dead.tail()}",
                        )
                    elif res.error:
                        _fail(p, f"round {rnd + 1}, concurrency {conc}: {res.error}")
                    elif not ok:
                        _fail(
                            p, f"round {rnd + 1}, concurrency {conc}: every request failed: {_first_error(res.records)}"
                        )
                    vals = metric_values([r for r in ok if r.get("split")], primary)
                    import numpy as np

                    p50 = f"{float(np.median(vals)):.3f} ms" if vals else "–"
                    log(
                        f"[{k}/{n_runs}] round {rnd + 1} c={conc} {p.name}: {len(ok)} ok, "
                        f"{len(failed)} err, p50 {p50}"
                        + (f"  FAILED: {p.reason}" if p.status == "failed" else "")
                        + (
                            f"  CLIENT SATURATED: {res.client.get('reason')}"
                            if res.client and res.client.get("saturated")
                            else ""
                        )
                        + (
                            f"  ACCOUNTING: {res.accounting['unexplained']} unexplained difference(s)"
                            if res.accounting and res.accounting["unexplained"]
                            else ""
                        )
                    )
        if capture is not None:
            capture.stop()
        if cfg.tracing:
            time.sleep(1.5)  # servers and gateways export spans every 0.5 s
        server_startup = stack.server_startup_ms() if cfg.mode == "local" else None
    finally:
        if capture is not None:
            capture.stop()
        stack.close()
    report = build_report(cfg, paths, results, warmups, primary, started, t_start)
    if server_startup:
        report["server_startup_ms"] = server_startup
    report["meta"]["placement"] = stack.placement.as_dict()
    if capture is not None:
        attach_witness(report, paths, results, capture.path, log)
    if cfg.tracing:
        try:
            attach_traces(cfg, report, results, out, log)
        except Exception as exc:  # traces are a bonus; never lose the report for them
            report["traces_error"] = f"{type(exc).__name__}: {exc}"
            log(f"traces: {report['traces_error']}")
    write_reports(report, results, out, html, primary)
    return report


def _metrics_urls(stack: Any, p: Path_) -> dict[str, str]:
    urls = {}
    if stack.server_http and p.target.kind != "external":
        urls["server"] = f"http://{stack.server_http}/metrics"
    if p.gateway_metrics:
        urls["gateway"] = p.gateway_metrics
    return urls


def _scrape(stack: Any, p: Path_) -> dict[str, Any]:
    from pathprobe.analysis import accounting

    return {kind: accounting.scrape(url, kind) for kind, url in _metrics_urls(stack, p).items()}


def _account(stack: Any, p: Path_, before: dict[str, Any], res: RunResult, run_dir: Path) -> dict[str, Any] | None:
    """The run's requests as the server and gateway counted them, set against the records."""
    from pathprobe.analysis import accounting

    urls = _metrics_urls(stack, p)
    if not urls:
        return None
    if "gateway" in urls:
        accounting.settle(urls["gateway"], ["pathprobe_gateway_upstream_outstanding"])
    if "server" in urls:
        accounting.settle(urls["server"], ["pathprobe_server_running", "pathprobe_server_queue_depth"])
    after = _scrape(stack, p)
    delta = {}
    for kind in urls:
        if before.get(kind) is None or after.get(kind) is None:
            return {"error": f"{kind} /metrics unreachable", "unexplained": 0, "differences": []}
        d = after[kind].copy()
        d.subtract(before[kind])
        delta[kind] = +d  # drop zero counts
    block = accounting.reconcile(res.records, delta.get("server"), delta.get("gateway"))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "accounting.json").write_text(json.dumps(block, indent=1), encoding="utf-8")
    return block


def _account_batch(
    stack: Any, paths: list[Path_], before: dict[str, dict[str, Any]], batch: dict[str, RunResult]
) -> None:
    """Accounting of a call-by-call interleaved run: each gateway serves only its configuration's
    calls (set against that configuration's records); the server serves them all (set against
    every configuration's records together, the same block on each)."""
    from pathprobe.analysis import accounting

    server_url = f"http://{stack.server_http}/metrics" if stack.server_http else ""
    if server_url:
        accounting.settle(server_url, ["pathprobe_server_running", "pathprobe_server_queue_depth"])
    server_after = accounting.scrape(server_url, "server") if server_url else None
    server_before = next((b.get("server") for b in before.values() if b.get("server") is not None), None)
    everything = [r for p in paths if p.name in batch for r in batch[p.name].records]
    whole = None
    if server_after is not None and server_before is not None:
        d = server_after.copy()
        d.subtract(server_before)
        whole = accounting.reconcile(everything, +d)
    for p in paths:
        res = batch.get(p.name)
        if res is None:
            continue
        block: dict[str, Any] = {"differences": [], "unexplained": 0, "lost": 0}
        if p.gateway_metrics and before[p.name].get("gateway") is not None:
            accounting.settle(p.gateway_metrics, ["pathprobe_gateway_upstream_outstanding"])
            after = accounting.scrape(p.gateway_metrics, "gateway")
            if after is not None:
                d = after.copy()
                d.subtract(before[p.name]["gateway"])
                block = accounting.reconcile(res.records, None, +d)
        else:
            block = accounting.reconcile(res.records, None)
        if whole is not None:
            block["server_interleaved"] = whole
            block["unexplained"] += whole["unexplained"]
            block["differences"] = block["differences"] + whole["differences"]
            if not p.gateway_metrics:
                block["lost"] = whole["lost"]
        res.accounting = block
        res.out_dir.mkdir(parents=True, exist_ok=True)
        (res.out_dir / "accounting.json").write_text(json.dumps(block, indent=1), encoding="utf-8")


def _first_error(records: list[dict[str, Any]]) -> str:
    for r in records:
        if not r.get("ok") and r.get("status") != "STOPPED":
            return f"{r.get('status')}: {r.get('error')}"
    return "no request was sent"


def _fail(p: Path_, reason: str) -> None:
    if p.status != "failed":
        p.status, p.reason = "failed", reason


def build_report(
    cfg: CompareConfig,
    paths: dict[str, Path_],
    results: dict[str, list[RunResult]],
    warmups: dict[str, RunResult],
    primary: str,
    started: str,
    t_start: float,
) -> dict[str, Any]:
    import numpy as np

    concs = cfg.load.concurrency
    report_targets: dict[str, Any] = {}
    samples: dict[str, dict[int, list[float]]] = {}
    for t in cfg.enabled_targets:
        p = paths.get(t.name) or Path_(t, status="failed", reason="not started")
        entry: dict[str, Any] = {
            "status": p.status if p.status != "pending" else "failed",
            "reason": p.reason,
            "kind": t.kind,
            "protocol": t.protocol,
            "mode": t.mode,
            "upstream": t.upstream,
            "url": p.url,
            "notes": p.notes,
            "tls_handshake": p.tls_handshake,
            "network": _network_info(cfg.network_for(t)),
            "by_concurrency": {},
        }
        w = warmups.get(t.name)
        if w is not None:
            ok = sorted((r for r in w.records if r.get("ok")), key=lambda r: r.get("ts", 0))
            if ok:
                entry["cold_start"] = {
                    "first_ms": float(ok[0]["e2e_ms"]),
                    "probe_ms": p.probe_ms,
                    "warmup_p50_ms": float(np.median([r["e2e_ms"] for r in ok])),
                    "n": len(w.records),
                }
        elif p.probe_ms is not None:
            entry["cold_start"] = {"first_ms": p.probe_ms, "probe_ms": p.probe_ms, "n": 0}
        samples[t.name] = {}
        for conc in concs:
            runs = [r for r in results.get(t.name, []) if r.concurrency == conc]
            if not runs:
                continue
            recs = [rec for r in runs for rec in r.records]
            rounds = {r.round: r.records for r in runs}
            g = summarize_group(
                recs, duration_s=sum(r.duration_s for r in runs), primary=primary, n_boot=cfg.bootstrap, rounds=rounds
            )
            client = client_summary({r.round: r.client for r in runs})
            if client is not None:
                g["client"] = client
            cpu = path_cpu(runs)
            if cpu is not None:
                g["path_cpu"] = cpu
            hops = summarize_hops(recs, hop_names(t))
            if hops is not None:
                g["path"] = hops
            acct = accounting_merge(r.accounting for r in runs)
            if acct is not None:
                g["accounting"] = acct
            entry["by_concurrency"][str(conc)] = g
            if entry["status"] == "ok":
                samples[t.name][conc] = metric_values([r for r in recs if r.get("ok") and r.get("split")], primary)
        report_targets[t.name] = entry
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
        "meta": {
            "started": started,
            "finished": now_iso(),
            "wall_s": round(time.monotonic() - t_start, 1),
            "mode": cfg.mode,
            "engine": f"{cfg.server.engine} / {cfg.server.model}" if cfg.mode == "local" else "remote",
            "host": platform.node(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "versions": versions(),
            "config": json.loads(cfg.model_dump_json()),
        },
        "baseline": baseline,
        "concurrency": concs,
        "method": method_summary(cfg, primary),
        "network": _network_info(cfg.network if cfg.network and cfg.network.active else None),
        "targets": report_targets,
        "verdicts": verdicts,
        "e2e_verdicts": e2e_verdicts,
        "interleaved": interleaved,
        "client_warnings": warnings,
        "self_reports": self_reports,
        "_samples": samples,  # removed before writing
    }


def hop_names(t: TargetConfig) -> list[str] | None:
    """Display names of a path's reporting hops, outermost first, from its config."""
    if t.kind == "direct":
        return ["server"]
    if t.kind == "gateway":
        return [f"gw ({t.mode})", "server"]
    if t.kind == "chain":
        return [h.kind if h.kind != "gateway" else f"gw ({h.mode})" for h in t.chain or ()] + ["server"]
    if t.kind == "external":
        return None
    return [t.kind, "server"]


def read_path_cpu(run_dir: Path) -> float | None:
    try:
        return float(json.loads((run_dir / "path_cpu.json").read_text())["cpu_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def path_cpu(runs: list[RunResult]) -> dict[str, Any] | None:
    """CPU the path's own processes (gateway / proxy / relays, not the shared server) spent per
    request in these runs: their CPU seconds over every request the runs sent."""
    measured = [r for r in runs if r.path_cpu_s is not None]
    n = sum(len(r.records) for r in measured)
    if not measured or n == 0:
        return None
    cpu_s = sum(r.path_cpu_s or 0.0 for r in measured)
    return {
        "cpu_s": round(cpu_s, 4),
        "requests": n,
        "ms_per_request": round(cpu_s * 1e3 / n, 4),
        "what": "user+system CPU of the path's own processes and their children during the measured runs",
    }


def _paired_verdicts(
    cfg: CompareConfig,
    report_targets: dict[str, Any],
    results: dict[str, list[RunResult]],
    baseline: str,
    concs: list[int],
) -> list[dict[str, Any]]:
    """Interleaved runs: each configuration's path tax, its calls paired with the baseline's of the same
    cycle, and verdicts on the paired path-tax difference (see :mod:`pathprobe.analysis.paired`)."""
    verdicts: list[dict[str, Any]] = []
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
            if name != baseline and t["status"] == "ok" and recs.get(baseline):
                per[name] = g["paired"] = paired_mod.paired(recs.get(name, []), recs[baseline], n_boot=cfg.bootstrap)
        found = paired_mod.judge(per, baseline, conc, cfg.alpha)
        clients = [(t["by_concurrency"].get(str(conc)) or {}).get("client") or {} for t in report_targets.values()]
        if any(c.get("saturated") for c in clients):
            flag = "client saturated"
        elif any(c.get("contended") for c in clients):
            flag = "machine contended"
        else:
            flag = None
        for v in found:
            if flag:
                v["client_flag"] = flag
                v["text"] += (
                    f" -- FLAGGED: {flag} at this concurrency (the load generator waited for a CPU): "
                    "the path tax includes that waiting, and another run on this machine may differ"
                )
        verdicts += found
    return verdicts


def _network_info(net: Any) -> dict[str, Any] | None:
    if net is None:
        return None
    from pathprobe.netem.relay import LinkSpec

    return {
        "hop": net.hop,
        "describe": LinkSpec(net.delay_ms, net.jitter_ms, net.loss, net.rto_ms, net.rate_mbit).describe(),
        "delay_ms_one_way": net.delay_ms,
        "expected_request_ms": expected_shift_ms(net),
        "mechanism": "pathprobe's delaying TCP relay (pathprobe netem) inserted on the hop",
    }


def attach_traces(
    cfg: CompareConfig,
    report: dict[str, Any],
    results: dict[str, list[RunResult]],
    out: Path,
    log: Callable[[str], None],
) -> None:
    """List (and write as Jaeger files) the slowest requests' traces; check trace vs in-band split."""
    from pathprobe.analysis import traces as tr
    from pathprobe.analysis.records import agreement
    from pathprobe.analysis.tracesplit import split_trace

    files = sorted((out / "traces").glob("*.jsonl")) + sorted((out / "traces" / "client").glob("*.jsonl"))
    files = [f for f in files if f.stat().st_size > 0]
    if not files:
        return
    wanted: dict[str, list[dict[str, Any]]] = {}
    for name, runs in results.items():
        ok = [r for run in runs for r in run.records if r.get("ok") and r.get("trace_id")]
        wanted[name] = sorted(ok, key=lambda r: -float(r["e2e_ms"]))[: cfg.slowest]
    spans = tr.read_spans(files)
    traces = tr.group_traces(spans)
    for name, slow in wanted.items():
        entries = []
        for rank, r in enumerate(slow, 1):
            tid = r["trace_id"]
            item = {
                "trace_id": tid,
                "e2e_ms": float(r["e2e_ms"]),
                "round": r.get("_round", 0) + 1,
                "concurrency": r.get("_concurrency"),
                "split": r.get("split"),
            }
            if tid in traces:
                path = tr.write_trace_file([traces[tid]], out / "traces" / "slowest" / name / f"{rank:02d}-{tid}.json")
                item["file"] = str(path.relative_to(out))
            entries.append(item)
        report["targets"][name]["slowest"] = entries
        # trace-based split vs in-band, for this configuration
        recs = [r for run in results.get(name, []) for r in run.records]
        report["targets"][name]["trace_completeness"] = trace_completeness(
            recs, traces, expected_services(report["targets"][name])
        )
        ids = {r["trace_id"] for r in recs if r.get("trace_id")}
        mine = [traces[i] for i in ids if i in traces]
        if mine:
            agr = {src: agreement([split_trace(t, src) for t in mine], recs) for src in ("attributes", "durations")}
            report["targets"][name]["trace_agreement"] = {
                src: {
                    "matched": a["matched"],
                    "agree": a["agree"],
                    "rule": a["rule"],
                    "max_abs_diff_ms": {k: v["max_abs_diff_ms"] for k, v in a["segments"].items()},
                    "outside": {k: v["outside"] for k, v in a["segments"].items()},
                }
                for src, a in agr.items()
            }
    log(f"traces: {len(traces)} traces from {len(files)} files; slowest written under {out / 'traces' / 'slowest'}")


def attach_witness(
    report: dict[str, Any],
    paths: dict[str, Path_],
    results: dict[str, list[RunResult]],
    pcap: Path,
    log: Callable[[str], None],
) -> None:
    """Per configuration, at concurrency 1: wire vs stack time per link from the capture, beside the
    split's network per link (see :mod:`pathprobe.analysis.witness`)."""
    from pathprobe.analysis import witness as wit

    try:
        packets = wit.read_packets(pcap)
    except Exception as exc:  # the report stands without the witness
        report["witness_error"] = f"{type(exc).__name__}: {exc}"
        log(f"witness: {report['witness_error']}")
        return
    report["witness"] = {
        "file": str(pcap),
        "packets": len(packets),
        "method": "tcpdump -i lo, nanosecond timestamps (CLOCK_REALTIME); requests at "
        "concurrency 1; client t0 mapped to the wall clock per request",
    }
    for name, p in paths.items():
        if p.status != "ok" or not p.chain or name not in report["targets"]:
            continue
        chain = wit.Chain([wit.LinkPorts(list(ports), inner) for ports, inner in p.chain])
        recs = [rec for r in results.get(name, []) if r.concurrency == 1 for rec in r.records]
        report["targets"][name]["witness"] = wit.analyze(recs, packets, chain)
    log(f"witness: {len(packets)} data packets matched to the requests at concurrency 1")


#: what a trace check calls vLLM's own span (trace completeness)
VLLM_SERVICE = "vllm"


def expected_services(target: dict[str, Any]) -> list[str]:
    """The spans a complete trace of this configuration holds: the client's, each pathprobe hop's
    SERVER span and the engine's children (nginx and external servers export none here)."""
    want = ["pathprobe-loadgen"]
    if target.get("kind") == "gateway":
        want.append("pathprobe-gateway")
    if target.get("kind") == "vllm" or target.get("upstream") == "vllm":
        want.append(VLLM_SERVICE)  # vLLM's own llm_request span (its engine's intervals)
    elif target.get("kind") in ("direct", "gateway", "nginx"):
        want += ["pathprobe-server", "engine"]
    return want


def trace_completeness(recs: list[dict[str, Any]], traces: dict[str, Any], want: list[str]) -> dict[str, Any]:
    """Share of ok requests whose trace has every expected span (see :func:`expected_services`)."""
    ok = [r for r in recs if r.get("ok")]
    missing: dict[str, int] = {}
    complete = 0
    for r in ok:
        t = traces.get(r.get("trace_id") or "")
        have: set[str] = set()
        if t is not None:
            for sp in t.spans:
                if sp.service == "pathprobe-loadgen" and sp.kind == "CLIENT":
                    have.add("pathprobe-loadgen")
                elif sp.kind == "SERVER" and sp.service in ("pathprobe-gateway", "pathprobe-server"):
                    have.add(sp.service)
                elif sp.name.startswith("engine."):
                    have.add("engine")
                elif sp.name == VLLM_SPAN:
                    have.add(VLLM_SERVICE)
        gone = [w for w in want if w not in have]
        for w in gone:
            missing[w] = missing.get(w, 0) + 1
        complete += not gone
    return {
        "expected": want,
        "requests": len(ok),
        "complete": complete,
        "share": complete / len(ok) if ok else None,
        "missing": missing,
    }


def write_reports(
    report: dict[str, Any], results: dict[str, list[RunResult]], out: Path, html: bool, primary: str
) -> None:
    from pathprobe.analysis.html import json_safe, render

    samples = report.pop("_samples", {})
    report["files"] = {"json": str(out / "report.json")}
    if html:
        report["files"]["html"] = str(out / "report.html")
    (out / "report.json").write_text(json.dumps(json_safe(report), indent=1), encoding="utf-8")
    if html:
        records = {name: {} for name in results}
        for name, runs in results.items():
            for run in runs:
                records[name].setdefault(run.concurrency, []).extend(run.records)
        render(report, samples, records, out / "report.html")
    (out / "report.md").write_text(markdown(report) + "\n", encoding="utf-8")


def rerender(
    out: Path,
    *,
    baseline: str | None = None,
    alpha: float | None = None,
    html: bool = True,
    log: Callable[[str], None] = _stderr,
) -> dict[str, Any]:
    """Rebuild the reports of a finished compare from its ``runs/`` folder, without running anything
    (e.g. with another baseline or alpha). Statuses, reasons and cold starts come from the old report.json."""
    from pathprobe.analysis.records import read_records

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
    from pathprobe.analysis.config import parse_config

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
                    recs = read_records(d / "records.jsonl")
                    for r in recs:
                        r["_round"], r["_concurrency"] = rnd, conc
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
