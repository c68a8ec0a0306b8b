"""Per-call pairing, path-tax verdicts, trace completeness and ok-without-server-timing, on data."""

from __future__ import annotations

import random

from pathprobe.analysis.compare import expected_services, trace_completeness
from pathprobe.analysis.paired import judge, paired, path_tax, tax_summary
from pathprobe.analysis.report import summarize_group
from pathprobe.analysis.traces import Span, Trace


def _rec(cycle: int, rnd: int, tax: float, engine: float, srv: bool = True) -> dict:
    return {
        "ok": True,
        "cycle": cycle,
        "_round": rnd,
        "_concurrency": 1,
        "worker": "local",
        "user": 0,
        "e2e_ms": tax + engine,
        "status": "OK",
        "entries": {"srv.total": engine + 0.2} if srv else {},
        "split": {
            "e2e": tax + engine,
            "network": tax * 0.6,
            "network_hop1": tax * 0.6,
            "network_hop2": 0.0,
            "serialization": tax * 0.1,
            "queueing": 0.0,
            "inference": engine,
            "other": tax * 0.3,
            "unsplit": 0.0,
        },
    }


def _runs(extra_ms: float, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Baseline and configuration, 3 rounds x 60 cycles; the engine's time is large and noisy and the
    same within a cycle's pair only by chance; the configuration's path costs ``extra_ms`` more."""
    rng = random.Random(seed)
    base, conf = [], []
    for rnd in range(3):
        for c in range(60):
            tax = 1.0 + rng.random() * 0.2
            base.append(_rec(c, rnd, tax, rng.uniform(20, 60)))
            conf.append(_rec(c, rnd, tax + extra_ms + rng.uniform(-0.1, 0.1), rng.uniform(20, 60)))
    return base, conf


def test_path_tax_leaves_the_engine_out():
    r = _rec(0, 0, 1.5, 40.0)
    assert abs(path_tax(r) - 1.5) < 1e-9
    s = tax_summary([r])
    assert abs(s["path_tax"]["p50"] - 1.5) < 1e-9 and abs(s["engine"]["p50"] - 40.0) < 1e-9


def test_a_clear_path_difference_gets_a_verdict_under_engine_noise():
    base, conf = _runs(0.5)
    res = {"gw": paired(conf, base, n_boot=200)}
    verdicts = judge(res, "direct", 1, 0.05)
    assert res["gw"]["n"] == 180 and 0.4 < res["gw"]["path_tax"]["median"]["value"] < 0.7
    assert [v["target"] for v in verdicts] == ["gw"] and res["gw"]["rounds_agree"]


def test_no_difference_and_a_difference_below_the_minimum_get_none():
    for extra in (0.0, 0.05):  # the minimum is max(0.1 ms, 5% of ~1.1 ms)
        base, conf = _runs(extra, seed=1)
        res = {"gw": paired(conf, base, n_boot=200)}
        assert judge(res, "direct", 1, 0.05) == [], res["gw"]["path_tax"]


def test_ok_answers_without_server_timing_are_counted():
    recs = [_rec(i, 0, 1.0, 10.0) for i in range(8)] + [_rec(8 + i, 0, 1.0, 10.0, srv=False) for i in range(2)]
    g = summarize_group(recs, duration_s=1.0, n_boot=100)
    assert g["ok_without_server_timing"] == 2


def _span(tid: str, sid: str, parent: str, name: str, kind: str, service: str) -> Span:
    return Span(tid, sid, parent, name, kind, 0, 1_000_000, service=service)


def test_trace_completeness_names_what_is_missing():
    want = expected_services({"kind": "gateway"})
    assert want == ["pathprobe-loadgen", "pathprobe-gateway", "pathprobe-server", "engine"]
    full = Trace(
        "t1",
        [
            _span("t1", "a", "", "grpc.Generate", "CLIENT", "pathprobe-loadgen"),
            _span("t1", "b", "a", "gw", "SERVER", "pathprobe-gateway"),
            _span("t1", "c", "b", "srv", "SERVER", "pathprobe-server"),
            _span("t1", "d", "c", "engine.prefill", "INTERNAL", "pathprobe-server"),
        ],
    )
    no_gw = Trace(
        "t2",
        [
            _span("t2", "a", "", "grpc.Generate", "CLIENT", "pathprobe-loadgen"),
            _span("t2", "c", "a", "srv", "SERVER", "pathprobe-server"),
            _span("t2", "d", "c", "engine.prefill", "INTERNAL", "pathprobe-server"),
        ],
    )
    recs = [{"ok": True, "trace_id": "t1"}, {"ok": True, "trace_id": "t2"}, {"ok": True, "trace_id": "t3"}]
    out = trace_completeness(recs, {"t1": full, "t2": no_gw}, want)
    assert out["complete"] == 1 and out["requests"] == 3 and abs(out["share"] - 1 / 3) < 1e-9
    assert out["missing"] == {"pathprobe-gateway": 2, "pathprobe-loadgen": 1, "pathprobe-server": 1, "engine": 1}
