"""The per-request waterfall (analysis/waterfall.py) and its plot, from records alone."""

from __future__ import annotations

import itertools

import pytest
from pathprobe import serverreports, timing
from pathprobe.analysis.report import waterfall


def _record(e2e: float, chain: str, report=None, est: float | None = None) -> dict:
    entries = timing.parse_chain(chain)
    full = serverreports.with_report(entries, report)
    sp = serverreports.split(e2e, full, report, 0.1, 0.2, network_estimate_ms=serverreports.network_estimate(full, est))
    d = {
        k: getattr(sp, k)
        for k in ("e2e", "network", "serialization", "queueing", "inference", "other", "unsplit", "network_estimated")
    }
    d["links"] = list(sp.links)
    d["hops"] = [
        {"label": h.label, "total": h.total, "serialization": h.serialization, "other": h.other} for h in sp.hops
    ]
    return {
        "ok": True,
        "e2e_ms": e2e,
        "client_encode_ms": 0.1,
        "client_decode_ms": 0.2,
        "entries": dict(entries),
        "split": d,
        "server_report": {"source": report.source, "entries": report.entries} if report else None,
    }


def test_our_server_behind_a_gateway_nests_with_its_phases_in_order() -> None:
    rec = _record(
        12.0,
        "srv.decode;dur=0.1, srv.tokenize;dur=0.2, srv.queue;dur=1.0, srv.prefill;dur=2.0, "
        "srv.decode_steps;dur=5.0, srv.encode;dur=0.1, srv.total;dur=9.0, "
        "gw.decode;dur=0.1, gw.upstream;dur=10.0, gw.encode;dur=0.1, gw.total;dur=11.0",
    )
    bs = waterfall.bars(rec)
    rows = list(dict.fromkeys(b.row for b in bs))
    assert rows == ["client", "gw", "srv"]
    gw = next(b for b in bs if b.row == "gw" and b.part == "span")
    srv = next(b for b in bs if b.row == "srv" and b.part == "span")
    assert gw.dur == 11.0 and srv.dur == 9.0
    assert gw.start >= 0.1 and gw.end <= 11.8 and gw.start <= srv.start and srv.end <= gw.end  # nested
    phases = [b for b in bs if b.row == "srv" and b.part != "span"]
    assert [b.label for b in phases] == ["decode", "tokenize", "queue", "prefill", "decode_steps", "encode"]
    assert all(a.end == pytest.approx(b.start) for a, b in itertools.pairwise(phases))  # in pipeline order
    assert not any(b.part == "unsplit" for b in bs)


def test_a_stream_whose_hops_report_send_still_nests() -> None:
    # the hops' waits on their transport (srv.send, gw.send) are their links' network, inside their totals
    rec = _record(
        12.0,
        "srv.decode;dur=0.1, srv.queue;dur=1.0, srv.prefill;dur=2.0, srv.decode_steps;dur=4.0, "
        "srv.encode;dur=0.1, srv.send;dur=0.9, srv.total;dur=9.0, "
        "gw.decode;dur=0.1, gw.upstream;dur=9.2, gw.encode;dur=0.1, gw.send;dur=0.8, gw.total;dur=11.0",
    )
    assert rec["split"]["links"] == pytest.approx([12.0 - 0.3 - 11.0 + 0.8, 9.2 - 9.0 + 0.9])
    bs = waterfall.bars(rec)
    gw = next(b for b in bs if b.row == "gw" and b.part == "span")
    srv = next(b for b in bs if b.row == "srv" and b.part == "span")
    assert gw.dur == 11.0 and srv.dur == 9.0
    assert gw.start >= 0.1 and gw.end <= 11.8 and gw.start <= srv.start and srv.end <= gw.end  # nested


def test_a_silent_server_is_one_unsplit_bar_with_the_engine_phases_it_reported_inside() -> None:
    rep = serverreports.ServerReport(
        serverreports.VLLM, {"srv.queue": 1.0, "srv.prefill": 3.0, "srv.decode_steps": 10.0}
    )
    rec = _record(20.0, "", rep, est=0.2)
    bs = waterfall.bars(rec)
    silent = [b for b in bs if b.part == "unsplit"]
    assert len(silent) == 1 and silent[0].row == "server (unsplit)"
    assert silent[0].dur == pytest.approx(20.0 - 0.3 - 0.2)  # the link less the estimated network
    engine = [b for b in bs if b.row.startswith("engine")]
    assert [b.label for b in engine] == ["queue", "prefill", "decode_steps"]
    assert silent[0].start <= engine[0].start and engine[-1].end <= silent[0].end
    # nothing reported: the unsplit bar alone
    bare = waterfall.bars(_record(20.0, "", None, est=0.2))
    assert [b.part for b in bare if b.row != "client"] == ["unsplit"]


def test_the_report_plots_one_waterfall_per_configuration() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from pathprobe.analysis.report.model import Group, Meta, Method, Report, Target
    from pathprobe.analysis.report.plots import plot_waterfalls

    rep = serverreports.ServerReport(serverreports.VLLM, {"srv.queue": 1.0, "srv.prefill": 3.0})
    recs = {
        "ours": {1: [_record(9.5, "srv.queue;dur=1.0, srv.prefill;dur=5.0, srv.total;dur=8.0")]},
        "theirs": {1: [_record(20.0, "", rep, est=0.2)]},
    }
    report = Report(
        meta=Meta(config={}),
        baseline="ours",
        concurrency=[1],
        method=Method(primary_metric="e2e", summary=""),
        targets={n: Target(status="ok", by_concurrency={"1": Group(ok=1)}) for n in recs},
    )
    png = plot_waterfalls(report, recs)
    assert png and len(png) > 1000
    assert waterfall.representative([]) is None
