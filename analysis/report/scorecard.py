"""The scorecard: what each configuration adds, in the terms the field reads, against the direct
path of the SAME client protocol (an HTTP gateway against the server's HTTP front end, a gRPC one
against its gRPC port), from calls paired within the same cycle of an interleaved run.

Per configuration, at the lowest concurrency measured (one request in flight when it is 1):

- **added p50 / p99**: percentile of the configuration's end-to-end time minus the same percentile
  of its direct path's, over the same cycles (a call and its direct partner saw the same moment of
  the machine); 95 % interval by resampling cycles, pairs kept;
- **added TTFT p50 / p99** (streams): the same, on time to first token chunk;
- **added chunk gap p50 / p99** (streams): percentile of every inter-chunk gap of the configuration
  minus the same of its direct path's gaps, the same cycles resampled;
- **segments**: the mean paired difference of each segment of the split (where the added time went);
- the buffering verdict (a proxy that holds a stream back), CPU per request of the configuration's
  own processes, and their memory (RSS) at rest and after load;
- when the report has a throughput frontier: the most requests/s at which the added p99 held each
  bound, and the most concurrent streams at the stream bound.

Nothing is guessed: a figure that cannot be made (no pairs, not a stream, no own process) is None.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
from pathprobe.analysis.report.model import Estimate, Report, Scorecard, ScoreRow
from pathprobe.analysis.report.paired import pairs
from pathprobe.segments import SEGMENTS

Record = Mapping[str, object]
#: what every figure is, said once under the table
FORMULA = (
    "added pNN = pNN(configuration) - pNN(direct path of the same client protocol), over calls paired "
    "within the same cycle; [95 % interval: cycles resampled, pairs kept]. Chunk gap = time between "
    "two consecutive content chunks at the client (every gap after the first chunk). Segments: mean "
    "paired difference. CPU: the configuration's own processes (not the shared server) per request."
)
N_BOOT = 400


def direct_for(report: Report) -> dict[str, str]:
    """Each ok configuration's direct counterpart: the first direct target of its client protocol
    (the plain front end before another one of the same protocol)."""
    directs: dict[str, str] = {}
    for name, t in report.targets.items():
        if t.kind == "direct" and t.status == "ok" and t.protocol and t.protocol not in directs:
            directs[t.protocol] = name
    return {
        name: directs[t.protocol]
        for name, t in report.targets.items()
        if t.status == "ok" and t.protocol in directs and directs[t.protocol] != name
    }


def build(
    report: Report, records: Mapping[str, Mapping[int, Sequence[Record]]], n_boot: int = N_BOOT
) -> Scorecard | None:
    """The scorecard of a report from its interleaved records (None without paired calls)."""
    if not report.concurrency:
        return None
    conc = min(report.concurrency)
    rows = [
        _row(
            report,
            name,
            direct,
            records.get(name, {}).get(conc, ()),
            records.get(direct, {}).get(conc, ()),
            conc,
            n_boot,
        )
        for name, direct in direct_for(report).items()
    ]
    rows = [r for r in rows if r.pairs]
    card = Scorecard(concurrency=conc, formula=FORMULA, rows=rows) if rows else None
    add_frontier(card, report)
    return card


def _row(
    report: Report, name: str, direct: str, recs: Sequence[Record], base: Sequence[Record], conc: int, n_boot: int
) -> ScoreRow:
    matched = pairs(recs, base)
    rng = np.random.default_rng(7)
    target = report.targets[name]
    group = target.at(conc)
    chunks = group.chunks if group is not None else None
    cpu = group.path_cpu if group is not None else None
    memory = target.memory
    return ScoreRow(
        target=name,
        against=direct,
        protocol=target.protocol,
        pairs=len(matched),
        added_p50=_added(matched, _e2e, 50, rng, n_boot),
        added_p99=_added(matched, _e2e, 99, rng, n_boot),
        added_ttft_p50=_added(matched, _ttft, 50, rng, n_boot),
        added_ttft_p99=_added(matched, _ttft, 99, rng, n_boot),
        added_gap_p50=_added_gaps(matched, 50, rng, n_boot),
        added_gap_p99=_added_gaps(matched, 99, rng, n_boot),
        segments=_segments(matched),
        buffering=chunks.buffering if chunks is not None and chunks.streams else None,
        cpu_ms_per_request=cpu.ms_per_request if cpu is not None else None,
        rss_rest_mb=memory.rest_mb if memory is not None else None,
        rss_load_mb=memory.load_mb if memory is not None else None,
    )


def add_frontier(card: Scorecard | None, report: Report) -> None:
    """Each row's frontier knees, when the report has its configuration's frontier."""
    if card is None or report.frontier is None:
        return
    for row in card.rows:
        found = report.frontier.targets.get(row.target)
        if found is not None and found.unary is not None:
            row.frontier_rps = {f"{k.bound_ms:g}": k for k in found.unary.knees}
        if found is not None and found.stream is not None and found.stream.knees:
            row.frontier_streams = found.stream.knees[0]


def _e2e(rec: Record) -> float | None:
    value = rec.get("e2e_ms")
    return float(value) if isinstance(value, int | float) else None


def _ttft(rec: Record) -> float | None:
    value = rec.get("ttft_ms")
    return float(value) if isinstance(value, int | float) else None


def _added(
    matched: Sequence[tuple[Record, Record]],
    value: Callable[[Record], float | None],
    q: float,
    rng: np.random.Generator,
    n_boot: int,
) -> Estimate | None:
    both = [(a, b) for r, d in matched if (a := value(r)) is not None and (b := value(d)) is not None]
    if len(both) < 2:
        return None
    x = np.array([a for a, _ in both])
    y = np.array([b for _, b in both])
    idx = rng.integers(0, len(both), (n_boot, len(both)))
    boot = np.percentile(x[idx], q, axis=1) - np.percentile(y[idx], q, axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return Estimate(value=float(np.percentile(x, q) - np.percentile(y, q)), lo=float(lo), hi=float(hi))


def _gaps(rec: Record) -> list[float]:
    gaps = rec.get("itl_ms")
    return [float(g) for g in gaps if isinstance(g, int | float)] if isinstance(gaps, list) else []


def _added_gaps(
    matched: Sequence[tuple[Record, Record]], q: float, rng: np.random.Generator, n_boot: int
) -> Estimate | None:
    per = [(_gaps(r), _gaps(d)) for r, d in matched]
    per = [(a, b) for a, b in per if a and b]
    if len(per) < 2:
        return None

    def diff(sample: Sequence[tuple[list[float], list[float]]]) -> float:
        a = np.concatenate([np.asarray(x) for x, _ in sample])
        b = np.concatenate([np.asarray(y) for _, y in sample])
        return float(np.percentile(a, q) - np.percentile(b, q))

    boot = [diff([per[i] for i in rng.integers(0, len(per), len(per))]) for _ in range(min(n_boot, 200))]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return Estimate(value=diff(per), lo=float(lo), hi=float(hi))


def _segments(matched: Sequence[tuple[Record, Record]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for seg in SEGMENTS:
        diffs = [
            float(a[seg]) - float(b[seg])
            for r, d in matched
            if isinstance(a := r.get("split"), dict) and isinstance(b := d.get("split"), dict) and seg in a and seg in b
        ]
        out[seg] = float(np.mean(diffs)) if diffs else None
    return out
