"""A chain of three reporting hops splits hop by hop, through `pathprobe compare`.

client -> gateway (http-proxy) -> gateway (transcode) -> server (synthetic engine): three
reporting hops (two of them ``gw.*``) and three links. The same chain runs four times in
one interleaved compare: as is, and with a one-way delay D on each link in turn (a
delaying relay on that link). A unary request crosses each link once each way, so only
the delayed link's network may grow, by 2 x D; the other links, every hop's own
serialization and the engine's inference must stay where they were.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.support.compare import run_compare

pytestmark = pytest.mark.slow

DELAY = 10.0  # one-way, ms
CHAIN = [{"kind": "gateway", "mode": "http-proxy"}, {"kind": "gateway", "mode": "transcode"}]


def _chain(delay_on: int | None) -> list[dict]:
    hops = [dict(h) for h in CHAIN]
    if delay_on in (1, 2):  # link 1: http-proxy -> transcode, link 2: transcode -> server
        hops[delay_on - 1]["network"] = {"delay_ms": DELAY}
    return hops


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chains")
    out = tmp / "out"
    targets = [
        {"name": "chain", "kind": "chain", "chain": _chain(None)},
        {"name": "chain-d0", "kind": "chain", "chain": _chain(None), "network": {"hop": "client", "delay_ms": DELAY}},
    ]
    targets += [{"name": f"chain-d{i}", "kind": "chain", "chain": _chain(i)} for i in (1, 2)]
    cfg = {
        "out": str(out),
        "bootstrap": 200,
        "tracing": True,
        "server": {
            "engine": "synthetic",
            "prefill_ms_per_token": 0.05,
            "decode_ms_per_token": 1.0,
            "max_batch_size": 4,
        },
        "load": {
            "duration_s": 2,
            "warmup_s": 1,
            "rounds": 2,
            "concurrency": [1],
            "stream": False,
            "prompt_tokens": 64,
            "max_tokens": 8,
        },
        "targets": targets,
    }
    return out, run_compare(cfg, tmp / "chains.yaml", html=True)


def _records(out: Path, name: str) -> list[dict]:
    recs = []
    for f in sorted((out / "runs" / name).glob("c*/r*/records.jsonl")):
        recs += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    ok = [r for r in recs if r["ok"]]
    assert len(ok) >= 20 and len(ok) == len(recs), (name, len(ok), len(recs))
    return ok


def _med(values) -> float:
    return statistics.median(values)


def _link(recs: list[dict], j: int) -> float:
    return _med(r["split"]["links"][j] for r in recs)


def _hop_ser(recs: list[dict], i: int) -> float:
    return _med(r["split"]["hops"][i]["serialization"] for r in recs)


def test_every_request_has_three_reporting_hops_and_three_links(run):
    out, report = run
    for name in ("chain", "chain-d0", "chain-d1", "chain-d2"):
        for r in _records(out, name):
            assert [h["kind"] for h in r["hops"]] == ["srv", "gw", "gw"]  # innermost first, both gw kept
            assert len(r["split"]["links"]) == 3 and len(r["split"]["hops"]) == 3
            assert r["split"]["unsplit"] == 0.0
            parts = ("network", "serialization", "queueing", "inference", "other", "unsplit")
            assert sum(r["split"][k] for k in parts) == pytest.approx(r["e2e_ms"], abs=1e-6)
        path = report["targets"][name]["by_concurrency"]["1"]["path"]
        assert [h["label"] for h in path["hops"]] == ["gw (http-proxy)", "gw (transcode)", "server"]
        assert len(path["links"]) == 3


@pytest.mark.parametrize("link", [0, 1, 2])
def test_a_delay_on_one_link_moves_only_that_links_network(run, link):
    out, _ = run
    base, wan = _records(out, "chain"), _records(out, f"chain-d{link}")
    grew = _link(wan, link) - _link(base, link)
    assert 2 * DELAY * 0.85 <= grew <= 2 * DELAY * 1.25, (link, grew)
    for other in {0, 1, 2} - {link}:
        assert abs(_link(wan, other) - _link(base, other)) < 2.0, (link, other)
    assert abs(_med(r["split"]["inference"] for r in wan) - _med(r["split"]["inference"] for r in base)) < 1.0


def test_every_hops_serialization_is_kept(run):
    out, _ = run
    for name in ("chain", "chain-d0", "chain-d1", "chain-d2"):
        recs = _records(out, name)
        transcode = _hop_ser(recs, 1)  # JSON -> protobuf -> JSON: the inner gateway's own work
        assert transcode > 0.02, name
        for r in recs:  # the segment is the client's plus every hop's, none lost to the merge
            hops = sum(h["serialization"] for h in r["split"]["hops"])
            assert r["split"]["serialization"] == pytest.approx(
                hops + r["client_encode_ms"] + r["client_decode_ms"], abs=1e-6
            )
    base = _records(out, "chain")
    for name in ("chain-d0", "chain-d1", "chain-d2"):
        assert abs(_hop_ser(_records(out, name), 1) - _hop_ser(base, 1)) < 0.3, name


def test_traces_split_the_chain_hop_by_hop_too(run):
    """From span timing alone (``durations``): both gateways' spans are hops of their own, and
    the typical request's per-link network agrees with the in-band split."""
    from pathprobe.analysis.report import traces as tr
    from pathprobe.analysis.report.tracesplit import split_trace

    out, _ = run
    recs = {r["trace_id"]: r for r in _records(out, "chain-d1") if r.get("trace_id")}
    files = [f for f in (out / "traces").rglob("*.jsonl") if f.stat().st_size > 0]
    traces = tr.group_traces(tr.read_spans(files))
    pairs = [(split_trace(traces[i], "durations"), r) for i, r in recs.items() if i in traces]
    assert len(pairs) >= 20
    for ts, _ in pairs:
        assert len(ts.split.links) == 3, ts.hops
        assert [h.split(":")[0] for h in ts.hops] == ["client", "gateway", "gateway", "server"]
    for j in range(3):
        diffs = sorted(abs(ts.split.links[j] - r["split"]["links"][j]) for ts, r in pairs)
        assert diffs[len(diffs) // 2] <= 0.5, (j, diffs[len(diffs) // 2])
    grew = _med(ts.split.links[1] for ts, _ in pairs)
    assert grew >= 2 * DELAY * 0.85  # the delayed link is found in the traces as well
