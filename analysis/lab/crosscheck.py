"""Cross-checks attached to a compare report: the slowest requests' traces (and the trace-based
split against the in-band one, and how complete the traces are), and the wire witness (packet
times per link against the split's network)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from pathprobe.analysis.lab.config import CompareConfig
from pathprobe.analysis.lab.loadrun import RunResult
from pathprobe.analysis.lab.paths import Path_
from pathprobe.serverreports import VLLM_SPAN

if TYPE_CHECKING:
    from pathprobe.analysis.report.records import TaggedRecord
    from pathprobe.analysis.report.traces import Trace


def attach_traces(
    cfg: CompareConfig,
    report: dict[str, Any],
    results: dict[str, list[RunResult]],
    out: Path,
    log: Callable[[str], None],
) -> None:
    """List (and write as Jaeger files) the slowest requests' traces; check trace vs in-band split."""
    from pathprobe.analysis.report import traces as tr

    files = sorted((out / "traces").glob("*.jsonl")) + sorted((out / "traces" / "client").glob("*.jsonl"))
    files = [f for f in files if f.stat().st_size > 0]
    if not files:
        return
    wanted: dict[str, list[TaggedRecord]] = {}
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
            report["targets"][name]["trace_agreement"] = _trace_check(report["targets"][name], mine, recs)
    log(f"traces: {len(traces)} traces from {len(files)} files; slowest written under {out / 'traces' / 'slowest'}")


def unseen_hops(target: Mapping[str, object]) -> list[str]:
    """The hops of a path that export no spans (they pass the client's traceparent on unchanged, as
    the propagation check found): a third-party proxy that reports its time in-band only."""
    found = target.get("propagation")
    hops = found.get("hops") if isinstance(found, dict) else None
    return [
        str(h.get("hop"))
        for h in (hops if isinstance(hops, list) else [])
        if isinstance(h, dict) and h.get("verdict") in ("passes unchanged", "no span")
    ]


def _trace_check(
    target: Mapping[str, object], traces: Sequence[Trace], recs: Sequence[TaggedRecord]
) -> dict[str, object]:
    """The trace-based split against the in-band one, per span source. Where a hop exports no spans,
    the trace cannot tell its two links and its own time apart: network and other are compared as one
    sum, hop 1 / hop 2 not at all, and the check says why (expected, not a disagreement)."""
    from pathprobe.analysis.report.records import UNSEEN_HOP_SEGMENTS, UNSEEN_HOP_SKIPPED, agreement
    from pathprobe.analysis.report.tracesplit import split_trace

    unseen = unseen_hops(target)
    together, skipped = (UNSEEN_HOP_SEGMENTS, UNSEEN_HOP_SKIPPED) if unseen else ((), ())
    out: dict[str, object] = {}
    for src in ("attributes", "durations"):
        a = agreement([split_trace(t, src) for t in traces], recs, together=together, skipped=skipped)
        out[src] = {
            "matched": a["matched"],
            "agree": a["agree"],
            "rule": a["rule"],
            "max_abs_diff_ms": {k: v["max_abs_diff_ms"] for k, v in a["segments"].items()},
            "outside": {k: v["outside"] for k, v in a["segments"].items()},
            "unseen_hops": unseen,
            "together": a["together"],
            "skipped": a["skipped"],
        }
    return out


def attach_witness(
    report: dict[str, Any],
    paths: dict[str, Path_],
    results: dict[str, list[RunResult]],
    pcap: Path,
    log: Callable[[str], None],
) -> None:
    """Per configuration: wire vs stack time per link from the capture, beside the split's network per
    link (see :mod:`pathprobe.analysis.lab.witness`). At concurrency 1 a request's packets are those in
    its time window; with tracing on, at every concurrency (1 too), also those its trace id is found in
    (:mod:`pathprobe.analysis.lab.wirestreams`), under ``by_concurrency``."""
    from pathprobe.analysis.lab import wirestreams
    from pathprobe.analysis.lab import witness as wit

    live = {name: p for name, p in paths.items() if p.status == "ok" and p.chain and name in report["targets"]}
    traced = {
        r.concurrency for name in live for r in results.get(name, []) if any(rec.get("trace_id") for rec in r.records)
    }
    try:
        packets = wit.read_packets(pcap)
        ports = {port for p in live.values() for ports_, _ in p.chain for port in ports_}
        by_trace = wirestreams.requests_by_trace(pcap, ports) if traced else {}
    except Exception as exc:  # the report stands without the witness
        report["witness_error"] = f"{type(exc).__name__}: {exc}"
        log(f"witness: {report['witness_error']}")
        return
    report["witness"] = {
        "file": str(pcap),
        "packets": len(packets),
        "method": "tcpdump -i lo, nanosecond timestamps (CLOCK_REALTIME); requests at concurrency 1 by "
        "their time window, above it by their trace id (traceparent in HTTP/1.1 heads and HTTP/2 header "
        "blocks); client t0 mapped to the wall clock per request",
        "traces_found": len(by_trace),
        "dropped_by_kernel": wit.kernel_drops(pcap.with_suffix(".log")),
    }
    if report["witness"]["dropped_by_kernel"]:
        log(
            f"witness: the kernel dropped {report['witness']['dropped_by_kernel']} packets (tcpdump fell "
            "behind): requests next to a lost packet are not matched by trace id"
        )
    for name, p in live.items():
        chain = wit.Chain([wit.LinkPorts(list(ports), inner) for ports, inner in p.chain])
        runs = results.get(name, [])
        w = wit.analyze([rec for r in runs if r.concurrency == 1 for rec in r.records], packets, chain)
        if traced:  # every concurrency, 1 included (where both ways apply, they must find the same packets)
            w["by_concurrency"] = {
                str(c): wit.analyze_by_trace(
                    [x for r in runs if r.concurrency == c for x in r.records], by_trace, chain
                )
                for c in sorted(traced)
            }
        report["targets"][name]["witness"] = w
    log(
        f"witness: {len(packets)} data packets; requests matched at concurrency 1 by time, and by trace id "
        f"({len(by_trace)} traces found in the packets)"
    )


#: what a trace check calls vLLM's own span (trace completeness)
VLLM_SERVICE = "vllm"


class TraceCompleteness(TypedDict):
    expected: list[str]
    requests: int
    complete: int
    share: float | None
    missing: dict[str, int]


def expected_services(target: Mapping[str, object]) -> list[str]:
    """The spans a complete trace of this configuration holds: the client's, each pathprobe hop's
    SERVER span and the engine's children, or vLLM's ``llm_request`` span when vLLM's own server is
    the upstream (nginx and external servers export none here)."""
    want = ["pathprobe-loadgen"]
    if target.get("kind") == "gateway":
        want.append("pathprobe-gateway")
    if target.get("kind") == "vllm" or target.get("upstream") == "vllm":
        want.append(VLLM_SERVICE)
    elif target.get("kind") in ("direct", "gateway", "nginx"):
        want += ["pathprobe-server", "engine"]
    return want


def trace_completeness(
    recs: Sequence[Mapping[str, object]], traces: Mapping[str, Trace], want: list[str]
) -> TraceCompleteness:
    """Share of ok requests whose trace has every expected span (see :func:`expected_services`)."""
    ok = [r for r in recs if r.get("ok")]
    missing: dict[str, int] = {}
    complete = 0
    for r in ok:
        t = traces.get(str(r.get("trace_id") or ""))
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
