"""One configuration's entry in a compare report: what was started, its cold start, and per
concurrency its figures (percentiles, segments, hops, the load generator's health, the path's CPU,
accounting), from its load runs."""

from __future__ import annotations

from typing import Any

from pathprobe.analysis.lab.accounting import merge as accounting_merge
from pathprobe.analysis.lab.config import CompareConfig, NetworkConfig, TargetConfig
from pathprobe.analysis.lab.loadrun import RunResult
from pathprobe.analysis.lab.paths import Path_, expected_shift_ms
from pathprobe.analysis.report.figures import client_summary, metric_values, summarize_group
from pathprobe.analysis.report.hops import summarize_hops
from pathprobe.analysis.report.model import ColdStart, NetworkInfo, PathCpu


def target_entry(
    cfg: CompareConfig, t: TargetConfig, p: Path_, warmup: RunResult | None, runs: list[RunResult], primary: str
) -> tuple[dict[str, Any], dict[int, list[float]]]:
    """Target ``t``'s report entry (``p``: its path), and its primary metric's samples per
    concurrency (ok configurations only: what the comparisons test)."""
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
        "network": network_info(cfg.network_for(t)),
        "by_concurrency": {},
    }
    cold = cold_start(p, warmup)
    if cold is not None:
        entry["cold_start"] = cold
    if p.rss_rest is not None or p.rss_load is not None:
        entry["memory"] = {
            "rest_mb": None if p.rss_rest is None else p.rss_rest / 2**20,
            "load_mb": None if p.rss_load is None else p.rss_load / 2**20,
        }
    samples: dict[int, list[float]] = {}
    for conc in cfg.load.concurrency:
        mine = [r for r in runs if r.concurrency == conc]
        if not mine:
            continue
        recs = [rec for r in mine for rec in r.records]
        entry["by_concurrency"][str(conc)] = concurrency_group(cfg, t, mine, primary)
        if entry["status"] == "ok":
            samples[conc] = metric_values([r for r in recs if r.get("ok") and r.get("split")], primary)
    return entry, samples


def cold_start(p: Path_, warmup: RunResult | None) -> ColdStart | None:
    """The first request after start-up: the warm-up's first (with the warm-up's median beside it),
    else the readiness probe's."""
    import numpy as np

    if warmup is not None:
        ok = sorted((r for r in warmup.records if r.get("ok")), key=lambda r: r.get("ts", 0))
        if not ok:
            return None
        return ColdStart(
            first_ms=float(ok[0]["e2e_ms"]),
            probe_ms=p.probe_ms,
            warmup_p50_ms=float(np.median([r["e2e_ms"] for r in ok])),
            n=len(warmup.records),
        )
    if p.probe_ms is not None:
        return ColdStart(first_ms=p.probe_ms, probe_ms=p.probe_ms, n=0)
    return None


def concurrency_group(cfg: CompareConfig, t: TargetConfig, runs: list[RunResult], primary: str) -> dict[str, Any]:
    """One configuration's figures at one concurrency, over its runs (one per round)."""
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
    return g


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


def path_cpu(runs: list[RunResult]) -> PathCpu | None:
    """CPU the path's own processes (gateway / proxy / relays, not the shared server) spent per
    request in these runs: their CPU seconds over every request the runs sent."""
    measured = [r for r in runs if r.path_cpu_s is not None]
    n = sum(len(r.records) for r in measured)
    if not measured or n == 0:
        return None
    cpu_s = sum(r.path_cpu_s or 0.0 for r in measured)
    return PathCpu(
        cpu_s=round(cpu_s, 4),
        requests=n,
        ms_per_request=round(cpu_s * 1e3 / n, 4),
        what="user+system CPU of the path's own processes and their children during the measured runs",
    )


def network_info(net: NetworkConfig | None) -> NetworkInfo | None:
    """A network condition as the report names it (None: no condition)."""
    if net is None:
        return None
    from pathprobe.netem.relay import LinkSpec

    return NetworkInfo(
        hop=net.hop,
        describe=LinkSpec(net.delay_ms, net.jitter_ms, net.loss, net.rto_ms, net.rate_mbit).describe(),
        delay_ms_one_way=net.delay_ms,
        expected_request_ms=expected_shift_ms(net),
        mechanism="pathprobe's delaying TCP relay (pathprobe netem) inserted on the hop",
    )
