"""Per-call pairing, path-tax verdicts, trace completeness and ok-without-server-timing, on data."""

from __future__ import annotations

import random

from pathprobe.analysis.lab.compare import expected_services, trace_completeness
from pathprobe.analysis.report.figures import summarize_group
from pathprobe.analysis.report.paired import (
    COSTS_LESS,
    COSTS_MORE,
    MIN_EFFECT_MS,
    NO_CLEAR,
    decide,
    judge,
    min_effect,
    paired,
    path_tax,
    tax_summary,
)
from pathprobe.analysis.report.traces import Span, Trace


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


def _runs(extra_ms: float, seed: int = 0, noise_ms: float = 0.1) -> tuple[list[dict], list[dict]]:
    """Baseline and configuration, 3 rounds x 60 cycles; the engine's time is large and noisy and the
    same within a cycle's pair only by chance; the configuration's path costs ``extra_ms`` more, give
    or take ``noise_ms`` (uniform) per call."""
    rng = random.Random(seed)
    base, conf = [], []
    for rnd in range(3):
        for c in range(60):
            tax = 1.0 + rng.random() * 0.2
            base.append(_rec(c, rnd, tax, rng.uniform(20, 60)))
            conf.append(_rec(c, rnd, tax + extra_ms + rng.uniform(-noise_ms, noise_ms), rng.uniform(20, 60)))
    return base, conf


def _judge(extra_ms: float, seed: int = 0, noise_ms: float = 0.1, **kw) -> tuple[dict, list[dict]]:
    base, conf = _runs(extra_ms, seed, noise_ms)
    res = {"gw": paired(conf, base, n_boot=400)}
    verdicts = judge(res, "direct", 1, 0.05, **kw)
    return res["gw"], verdicts


def test_path_tax_leaves_the_engine_out():
    r = _rec(0, 0, 1.5, 40.0)
    assert abs(path_tax(r) - 1.5) < 1e-9
    s = tax_summary([r])
    assert abs(s["path_tax"]["p50"] - 1.5) < 1e-9 and abs(s["engine"]["p50"] - 40.0) < 1e-9


def test_a_real_difference_gets_a_verdict_under_engine_noise():
    for extra, want in ((1.0, COSTS_MORE), (0.5, COSTS_MORE), (-1.0, COSTS_LESS)):
        r, verdicts = _judge(extra)
        assert r["n"] == 180 and abs(r["path_tax"]["median"]["value"] - extra) < 0.05
        assert r["verdict"] == want and r["significant"], r
        assert [(v["target"], v["verdict"]) for v in verdicts] == [("gw", want)]


def test_a_sure_but_tiny_difference_is_no_clear_difference():
    # 0.05 ms more on every call: the interval is tight and excludes 0, the test is sure of it,
    # but it is below the minimum effect (max(0.2 ms, 5% of ~1.1 ms)): no verdict
    r, verdicts = _judge(0.05, seed=1)
    med = r["path_tax"]["median"]
    assert med["lo"] > 0 and med["hi"] < 0.1 and r["p_adjusted"] < 1e-6  # sure, and tiny
    assert r["min_effect_ms"] == MIN_EFFECT_MS == 0.2
    assert r["verdict"] == NO_CLEAR and "minimum effect" in r["why"] and verdicts == []
    # the minimum is a setting: at 0.01 ms and 1% the same data gets its verdict
    r, verdicts = _judge(0.05, seed=1, min_ms=0.01, min_rel=0.01)
    assert r["verdict"] == COSTS_MORE and len(verdicts) == 1
    # the relative part: 50% of the baseline's ~1.1 ms path tax outweighs a 0.5 ms difference
    r, _ = _judge(0.5, seed=1, min_rel=0.5)
    assert 0.5 < r["min_effect_ms"] < 0.65 and r["verdict"] == NO_CLEAR


def test_noise_gets_no_verdict():
    # no difference, each call +-2 ms of noise: the interval includes 0
    for seed in range(5):
        r, verdicts = _judge(0.0, seed=seed, noise_ms=2.0)
        med = r["path_tax"]["median"]
        assert med["lo"] < 0 < med["hi"], med
        assert r["verdict"] == NO_CLEAR and verdicts == []


def test_verdicts_repeat_under_engine_noise():
    # ten independent "runs" of the same paths: the engine's 20-60 ms per call (drawn anew each
    # run) never moves a path-tax verdict; 1 ms is called every time, 0.05 ms and 0 never
    for extra, want in ((1.0, COSTS_MORE), (0.05, NO_CLEAR), (0.0, NO_CLEAR)):
        got = {_judge(extra, seed=10 + run, noise_ms=0.5)[0]["verdict"] for run in range(10)}
        assert got == {want}, (extra, got)


def test_decide_reasons():
    assert decide({"value": 1.0, "lo": 0.8, "hi": 1.2}, 0.001, 0.05, 0.2) == (COSTS_MORE, "")
    assert decide({"value": -0.3, "lo": -0.4, "hi": -0.15}, 0.001, 0.05, 0.2)[0] == COSTS_LESS  # the estimate decides
    assert decide({"value": 1.0, "lo": -0.1, "hi": 2.0}, 0.001, 0.05, 0.2) == (NO_CLEAR, "the 95% interval includes 0")
    v, why = decide({"value": 1.0, "lo": 0.8, "hi": 1.2}, 0.06, 0.05, 0.2)  # not sure once Holm-adjusted
    assert v == NO_CLEAR and "Holm" in why
    v, why = decide({"value": 0.19, "lo": 0.15, "hi": 0.25}, 0.001, 0.05, 0.2)
    assert v == NO_CLEAR and "minimum effect" in why
    assert min_effect(10.0) == 0.5 and min_effect(1.0) == 0.2
    assert min_effect(1.0, min_ms=0.05, min_rel=0.0) == 0.05


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
