"""``pathprobe analyze``: the segment split from exported traces.

Reads OTLP JSON (files or folders: our JSON-lines exports, an OpenTelemetry
Collector file exporter's output, Jaeger's ``{"result": ...}`` answers, Jaeger JSON)
or queries a Jaeger query API, rebuilds every trace and splits it with the same
formula as the load generator. Optionally checks the result against in-band
records and writes traces as files Jaeger's UI opens.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pathprobe.errors import ConfigError

if TYPE_CHECKING:
    from pathprobe.analysis.report.traces import Trace
    from pathprobe.analysis.report.tracesplit import TraceSplit

HELP = "segment breakdown from exported traces (OTLP JSON files, or a Jaeger query API)"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "analyze", help=HELP, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "inputs", nargs="*", metavar="FILE|DIR", help="OTLP JSON / JSON lines / Jaeger JSON files or folders"
    )
    p.add_argument(
        "--jaeger", metavar="URL", help="Jaeger query base URL, e.g. http://127.0.0.1:16686 (uses /api/v3/traces)"
    )
    p.add_argument("--service", help="with --jaeger: service whose traces to fetch (e.g. pathprobe-loadgen)")
    p.add_argument("--operation", help="with --jaeger: only this operation (span name)")
    p.add_argument("--lookback", default="1h", help="with --jaeger: how far back (30m, 2h, 1d); default 1h")
    p.add_argument("--limit", type=int, default=1000, help="with --jaeger: max traces (default 1000)")
    p.add_argument("--trace-id", action="append", default=[], help="only these traces (repeatable)")
    p.add_argument(
        "--from",
        dest="source",
        choices=("attributes", "durations"),
        default="attributes",
        help="attributes: exact values each hop recorded (default); durations: span timing only",
    )
    p.add_argument(
        "--records",
        action="append",
        default=[],
        metavar="records.jsonl",
        help="pathprobe load records: check the trace split against the in-band split",
    )
    p.add_argument("--json", metavar="PATH", help="write every trace's split (and the agreement) as JSON")
    p.add_argument(
        "--write-trace",
        action="append",
        default=[],
        metavar="ID|slowest:N",
        help="write these traces (or the N slowest) as files Jaeger's UI opens",
    )
    p.add_argument("--out", default="traces-out", help="folder for --write-trace files (default traces-out)")
    p.add_argument("--format", choices=("jaeger", "otlp"), default="jaeger", help="file format for --write-trace")
    p.add_argument("--per-trace", action="store_true", help="print one line per trace")
    p.set_defaults(func=run)


def _lookback(text: str) -> timedelta:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return timedelta(seconds=float(text[:-1]) * units[text[-1]])
    except (KeyError, ValueError, IndexError):
        raise ConfigError(f"--lookback: expected a number and a unit (s, m, h, d), got {text!r}") from None


def _slowest_count(spec: str) -> int:
    n = spec.split(":", 1)[1]
    if not n.isdigit() or int(n) < 1:
        raise ConfigError(f"--write-trace: expected slowest:N with N a positive integer, got {spec!r}")
    return int(n)


def run(args: argparse.Namespace) -> int:
    from pathprobe.analysis.report import traces as tr
    from pathprobe.analysis.report.tracesplit import split_trace

    if not args.inputs and not args.jaeger:
        raise ConfigError("give trace files/folders, or --jaeger URL")
    if args.jaeger and not args.jaeger.startswith(("http://", "https://")):
        raise ConfigError(f"--jaeger: expected the query API's base URL, http://HOST:PORT, got {args.jaeger!r}")
    slowest = {spec: _slowest_count(spec) for spec in args.write_trace if spec.startswith("slowest:")}
    spans = tr.read_spans(args.inputs) if args.inputs else []
    if args.jaeger:
        spans += tr.query_jaeger(
            args.jaeger,
            service=args.service,
            trace_ids=args.trace_id,
            lookback=_lookback(args.lookback),
            limit=args.limit,
            operation=args.operation,
        )
    traces = tr.group_traces(spans)
    if args.trace_id:
        wanted = {t.lower() for t in args.trace_id}
        traces = {k: v for k, v in traces.items() if k in wanted}
    if not traces:
        print("pathprobe analyze: no traces found", file=sys.stderr)
        return 1
    splits = [split_trace(t, args.source) for t in traces.values()]
    good = [s for s in splits if s.split is not None]
    print(f"{len(traces)} traces, {len(spans)} spans; split from span {args.source}")
    _print_splits(args, splits, good)
    result: dict[str, object] = {"source": args.source, "traces": [s.as_dict() for s in splits]}
    agree = _print_agreement(args.records, good, result) if args.records else True
    _write_traces(args, traces, good, slowest)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1), encoding="utf-8")
        print(f"wrote {args.json}")
    return 0 if agree else 3


def _print_splits(args: argparse.Namespace, splits: Sequence[TraceSplit], good: Sequence[TraceSplit]) -> None:
    """The traces' problems, the segment table per route, the paths hop by hop, one line per trace."""
    from pathprobe.analysis.report.markdown import render
    from pathprobe.analysis.report.tables import segment_table

    problems: dict[str, int] = {}
    for s in splits:
        if s.problem:
            problems[s.problem] = problems.get(s.problem, 0) + 1
    for msg, n in sorted(problems.items(), key=lambda kv: -kv[1]):
        print(f"  note: {n} trace(s): {msg}")
    by_route: dict[str, list[dict[str, Any]]] = {}
    for s in splits:
        if s.split is not None:
            by_route.setdefault(s.route or "?", []).append(s.split.as_dict())
    print()
    print(render([segment_table(by_route)]))
    _print_hops(by_route)
    if args.per_trace:
        print()
        for s in sorted(good, key=lambda s: -s.split.e2e):  # type: ignore[union-attr]
            d = s.split.as_dict()  # type: ignore[union-attr]
            print(
                f"{s.trace_id} {s.route:24s} "
                + " ".join(
                    f"{k}={d[k]:.3f}" for k in ("e2e", "network", "serialization", "queueing", "inference", "other")
                )
            )


def _print_hops(by_route: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """One line per route and chain shape (paths differ in length)."""
    from pathprobe.analysis.report.hops import format_path, summarize_hops
    from pathprobe.analysis.report.model import HopPath

    by_shape: dict[tuple[str, int, int], list[dict[str, object]]] = {}
    for route, sps in by_route.items():
        for sp in sps:
            by_shape.setdefault((route, len(sp["hops"]), len(sp["links"])), []).append({"ok": True, "split": sp})
    if not by_shape:
        return
    print()
    print("hop by hop (means, ms: each link's network, each reporting hop's own time and serialization):")
    for (route, _, _), recs in sorted(by_shape.items()):
        summary = summarize_hops(recs)
        if summary:
            print(f"  {route} ({len(recs)}): {format_path(HopPath.model_validate(summary))}")


def _print_agreement(paths: Sequence[str], good: Sequence[TraceSplit], result: dict[str, object]) -> bool:
    """The split from spans against the in-band records (``--records``): printed, and whether they agree."""
    from pathprobe.analysis.report.records import agreement, read_records

    records = [r for path in paths for r in read_records(path)]
    agr = agreement(list(good), records)
    result["agreement"] = agr
    print()
    print(
        f"agreement with in-band records ({agr['rule']}): {agr['matched']} traces matched of "
        f"{agr['records_with_trace']} records with a trace id"
    )
    for key, st in agr["segments"].items():
        print(f"  {key:14s} n={st['n']:5d}  outside={st['outside']:4d}  max |diff|={st['max_abs_diff_ms']:.3f} ms")
    print("  AGREE" if agr["agree"] else "  DISAGREE")
    return bool(agr["agree"])


def _write_traces(
    args: argparse.Namespace, traces: Mapping[str, Trace], good: Sequence[TraceSplit], slowest: Mapping[str, int]
) -> None:
    """``--write-trace``: the slowest N (complete traces first) or the traces named, one file each."""
    from pathprobe.analysis.report import traces as tr

    for spec in args.write_trace:
        if spec.startswith("slowest:"):
            # complete traces (with the client's span) first: a server-only trace's e2e is not the user's
            pool = [s for s in good if s.e2e_source != "outermost server span"] or list(good)
            chosen = [traces[s.trace_id] for s in sorted(pool, key=lambda s: -s.split.e2e)[: slowest[spec]]]  # type: ignore[union-attr]
        else:
            if spec.lower() not in traces:
                raise ConfigError(f"--write-trace: trace {spec} is not among the {len(traces)} traces read")
            chosen = [traces[spec.lower()]]
        for t in chosen:
            path = tr.write_trace_file([t], Path(args.out) / f"trace-{t.trace_id}.json", args.format)
            print(f"wrote {path} (open in Jaeger UI: Search -> Upload / JSON File)")
