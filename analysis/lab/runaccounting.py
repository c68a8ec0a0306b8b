"""Accounting of a compare's load runs: the path's ``/metrics`` (server, gateway) scraped before
and after a run and set against the run's records (see :mod:`pathprobe.analysis.lab.accounting`)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from pathprobe.analysis.lab import accounting
from pathprobe.analysis.lab.accounting import Accounting
from pathprobe.analysis.lab.loadrun import RunResult
from pathprobe.analysis.lab.paths import Path_
from pathprobe.analysis.lab.stack import Stack


def _metrics_urls(stack: Stack, p: Path_) -> dict[str, str]:
    urls = {}
    if stack.server_http and p.target.kind != "external":
        urls["server"] = f"http://{stack.server_http}/metrics"
    if p.gateway_metrics:
        urls["gateway"] = p.gateway_metrics
    return urls


#: a path's request counters by place (``server``, ``gateway``); None where /metrics did not answer
Counts = dict[str, Counter[str] | None]


def scrape(stack: Stack, p: Path_) -> Counts:
    return {kind: accounting.scrape(url, kind) for kind, url in _metrics_urls(stack, p).items()}


def account(stack: Stack, p: Path_, before: Counts, res: RunResult, run_dir: Path) -> Accounting | None:
    """The run's requests as the server and gateway counted them, set against the records."""
    urls = _metrics_urls(stack, p)
    if not urls:
        return None
    if "gateway" in urls:
        accounting.settle(urls["gateway"], ["pathprobe_gateway_upstream_outstanding"])
    if "server" in urls:
        accounting.settle(urls["server"], ["pathprobe_server_running", "pathprobe_server_queue_depth"])
    after = scrape(stack, p)
    delta = {}
    for kind in urls:
        was, now = before.get(kind), after.get(kind)
        if was is None or now is None:
            return {"error": f"{kind} /metrics unreachable", "unexplained": 0, "differences": []}
        d = now.copy()
        d.subtract(was)
        delta[kind] = +d  # drop zero counts
    block = accounting.reconcile(res.records, delta.get("server"), delta.get("gateway"))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "accounting.json").write_text(json.dumps(block, indent=1), encoding="utf-8")
    return block


def account_batch(stack: Stack, paths: list[Path_], before: dict[str, Counts], batch: dict[str, RunResult]) -> None:
    """Accounting of a call-by-call interleaved run: each gateway serves only its configuration's
    calls (set against that configuration's records); the server serves them all (set against
    every configuration's records together, the same block on each)."""
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
        block: Accounting = {"differences": [], "unexplained": 0, "lost": 0}
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
