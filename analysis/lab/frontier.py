"""The throughput frontier: the most load a path carries while what it adds stays under a bound.

For each bound (added p99 of 1 / 5 / 10 / 50 ms, say) the frontier is the highest offered load at
which the path's p99 minus the direct path's p99, measured side by side at the same load, stays
under the bound with no error. The load is an open-loop request rate (unary calls), or a number of
concurrent streams at a fixed pacing, where the figure is the added inter-chunk gap p99.

The search does not walk a fixed grid. It steps the load up geometrically until the largest bound
is crossed (or errors appear), then bisects each bound's interval between the last load that held
and the first that did not, until the two are within ``tolerance`` of each other; every load is
measured once and reused by every bound. A point where the load generator itself saturated
(``summary.json``'s ``client.saturated``) measures the client, not the path: it is refused — kept
with its reason, never used as a result — and the search stops there, saying so.

:func:`search` is the algorithm over any ``measure(load) -> Point``; :func:`rate_point` measures
one rate with two ``pathprobe load`` processes at once (the path and its direct path, each offered
``rate`` requests/s at constant spacing).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DEFAULT_BOUNDS_MS = (1.0, 5.0, 10.0, 50.0)


@dataclass(frozen=True, slots=True)
class Point:
    """One load, measured: what the path added over the direct path at that load."""

    load: float
    added_p50_ms: float | None
    added_p99_ms: float | None
    requests: int
    errors: int
    client_saturated: bool = False
    reason: str = ""
    #: the load generators' own health at this load (each process's ``client`` block, abridged)
    clients: dict[str, dict[str, object]] = field(default_factory=dict)
    achieved: float | None = None  # requests/s the path's load process completed (streams: streams)
    cpu_ms_per_request: float | None = None  # the path's own processes (not the shared server)
    rss_mb: float | None = None  # the path's own processes, after the step

    def holds(self, bound_ms: float) -> bool:
        return self.errors == 0 and self.added_p99_ms is not None and self.added_p99_ms <= bound_ms


@dataclass(frozen=True, slots=True)
class Knee:
    """One bound's frontier: ``load`` held (the highest measured that did); ``next_load`` did not.
    ``load`` None: even the first load crossed the bound; ``next_load`` None: nothing measured
    crossed it (the frontier is at least ``load``)."""

    bound_ms: float
    load: float | None
    next_load: float | None


@dataclass(slots=True)
class Frontier:
    knees: list[Knee] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    refused: list[Point] = field(default_factory=list)  # client saturated: not a measurement of the path
    note: str = ""

    def knee(self, bound_ms: float) -> Knee:
        return next(k for k in self.knees if k.bound_ms == bound_ms)


Measure = Callable[[float], Point]


def search(
    measure: Measure,
    bounds_ms: Sequence[float] = DEFAULT_BOUNDS_MS,
    *,
    start: float,
    limit: float,
    growth: float = 2.0,
    tolerance: float = 0.05,
    quantum: float = 0.0,
) -> Frontier:
    """Step up from ``start`` by ``growth`` (at most ``limit``), then bisect each bound's interval.
    ``quantum``: every load measured is a multiple of it (1: whole streams); an interval no
    quantum can split is as narrow as it gets."""
    out = Frontier()
    seen: dict[float, Point] = {}

    def at(load: float) -> Point | None:
        if load not in seen:
            point = measure(load)
            if point.client_saturated:
                out.refused.append(point)
                out.note = f"the load generator saturated at {load:g}: {point.reason}; higher loads not measured"
                return None
            seen[load] = point
            out.points.append(point)
        return seen[load]

    _step_up(at, max(bounds_ms), start, limit, growth, quantum)
    for bound in sorted(bounds_ms):
        out.knees.append(_bisect(at, seen, bound, tolerance, quantum))
    out.points.sort(key=lambda p: p.load)
    return out


def _quantize(load: float, quantum: float) -> float:
    return max(quantum, round(load / quantum) * quantum) if quantum > 0 else load


def _step_up(
    at: Callable[[float], Point | None], bound: float, start: float, limit: float, growth: float, quantum: float
) -> None:
    load = _quantize(start, quantum)
    while load <= limit:
        point = at(load)
        if point is None or not point.holds(bound):
            return
        # the limit itself is measured once
        load = _quantize(min(load * growth, limit), quantum) if load < limit else limit * 2


def _bisect(
    at: Callable[[float], Point | None], seen: dict[float, Point], bound: float, tolerance: float, quantum: float
) -> Knee:
    while True:
        held = [p.load for p in seen.values() if p.holds(bound)]
        broke = [p.load for p in seen.values() if not p.holds(bound)]
        lo = max((x for x in held if not broke or x < min(broke)), default=None)
        hi = min(broke) if broke else None
        if lo is None or hi is None or (hi - lo) <= tolerance * lo:
            return Knee(bound, lo, hi)
        mid = _quantize(math.sqrt(lo * hi), quantum)
        if mid in (lo, hi) and quantum > 0:
            mid = lo + quantum
        if mid >= hi or at(mid) is None:  # no load between, or refused: stop where the measurements end
            return Knee(bound, lo, hi)


def _p(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


Run = tuple[list[dict[str, object]], dict[str, object]]  # one load process's records and summary


def e2e_values(records: list[dict[str, object]]) -> list[float]:
    return [float(r["e2e_ms"]) for r in records if r.get("ok")]  # type: ignore[arg-type]


def latency_values(records: list[dict[str, object]]) -> list[float]:
    """Open loop: from the scheduled send to the end (a call that waited for a free user counts its wait)."""
    return [float(r.get("latency_ms", r["e2e_ms"])) for r in records if r.get("ok")]  # type: ignore[arg-type]


def gap_values(records: list[dict[str, object]]) -> list[float]:
    return [float(g) for r in records if r.get("ok") for g in r.get("itl_ms") or ()]  # type: ignore[attr-defined]


def point_from_runs(
    load: float, runs: dict[str, Run], warmup_s: float = 0.0, metric: Callable[..., list[float]] = latency_values
) -> Point:
    """A :class:`Point` from the path's run and its direct path's run at the same load (each the
    records and summary of one ``pathprobe load``), without each run's first ``warmup_s`` (its
    connections, first calls and the schedule catching up: start-up, not load). ``metric``: the
    values compared (e2e of each call; :func:`gap_values`: each stream's inter-chunk gaps)."""
    runs = {name: (_after(recs, warmup_s), summary) for name, (recs, summary) in runs.items()}
    e2e = {name: metric(recs) for name, (recs, _) in runs.items()}
    path_records = [r for r in runs["path"][0] if r.get("status") != "STOPPED"]
    errors = sum(not r.get("ok") for r in path_records)
    saturated = [(name, s["client"]) for name, (_, s) in runs.items() if _client(s).get("saturated")]
    return Point(
        load,
        _added(e2e, 50),
        _added(e2e, 99),
        len(path_records),
        errors,
        client_saturated=bool(saturated),
        reason="; ".join(f"{name}: {_client(runs[name][1]).get('reason')}" for name, _ in saturated),
        clients={name: health(_client(s)) for name, (_, s) in runs.items()},
        achieved=_rate(path_records),
    )


def health(client: dict[str, object]) -> dict[str, object]:
    """What a point keeps of a load process's ``client`` block: the verdict and the figures behind it."""

    def pick(key: str, sub: str) -> object:
        block = client.get(key)
        return block.get(sub) if isinstance(block, dict) else None

    return {
        "saturated": bool(client.get("saturated")),
        "contended": bool(client.get("contended")),
        "reason": client.get("reason"),
        "loop_lag_p99_ms": pick("loop_lag_ms", "p99"),
        "loop_busy_lag_p99_ms": pick("loop_busy_lag_ms", "p99"),
        "cpu_percent_mean": pick("cpu_percent", "mean"),
        "process_cpu_percent_mean": pick("cpu_percent", "process_mean"),
    }


def _rate(records: list[dict[str, object]]) -> float | None:
    """Completed calls per second over the span of their ends (None under two calls)."""
    ends = sorted(float(r["ts"]) + float(r.get("e2e_ms") or 0) / 1000 for r in records if r.get("ok"))  # type: ignore[arg-type]
    return (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 and ends[-1] > ends[0] else None


def _after(records: list[dict[str, object]], warmup_s: float) -> list[dict[str, object]]:
    if not records or warmup_s <= 0:
        return records
    t0 = min(float(r["ts"]) for r in records)  # type: ignore[arg-type]
    return [r for r in records if float(r["ts"]) >= t0 + warmup_s]  # type: ignore[arg-type]


def _client(summary: dict[str, object]) -> dict[str, object]:
    client = summary.get("client")
    return client if isinstance(client, dict) else {}


def _added(e2e: dict[str, list[float]], q: float) -> float | None:
    path, direct = _p(e2e["path"], q), _p(e2e["direct"], q)
    return None if path is None or direct is None else path - direct


def rate_point(
    path_url: str,
    direct_url: str,
    rate: float,
    *,
    duration_s: float = 3.0,
    warmup_s: float = 1.0,
    users: int = 64,
    extra_args: Sequence[str] = (),
    out: Path | None = None,
) -> Point:
    """The path and its direct path, each offered ``rate`` requests/s at constant spacing by a load
    process of its own, at the same time (so both see the same machine); the path's added p50/p99.
    Two processes rather than one interleaving calls: interleaving would make the arrivals at the
    path random, and a path's queueing would then follow the mix, not the load."""
    folder = out or Path(tempfile.mkdtemp(prefix="frontier-"))
    runs = _both(path_url, direct_url, rate, warmup_s + duration_s, users, extra_args, folder)
    return point_from_runs(rate, runs, warmup_s)


def stream_point(
    path_url: str,
    direct_url: str,
    streams: int,
    *,
    chunks: int = 64,
    duration_s: float = 5.0,
    warmup_s: float = 1.0,
    extra_args: Sequence[str] = (),
    out: Path | None = None,
) -> Point:
    """``streams`` concurrent streams of ``chunks`` chunks each (closed loop) through the path and,
    at the same time from another process, through its direct path; the path's added inter-chunk
    gap p50/p99. The pacing is the server's (e.g. the synthetic engine at 20 ms per token)."""
    folder = out or Path(tempfile.mkdtemp(prefix="frontier-streams-"))
    extra = ("--stream", "--max-tokens", str(chunks), *extra_args)
    runs = _both(path_url, direct_url, None, warmup_s + duration_s, streams, extra, folder)
    return point_from_runs(streams, runs, warmup_s, gap_values)


def _both(
    path_url: str,
    direct_url: str,
    rate: float | None,
    duration_s: float,
    users: int,
    extra: Sequence[str],
    folder: Path,
) -> dict[str, Run]:
    """The path's and the direct path's load processes, started together, each run to its end."""
    procs = {
        name: _start_load(url, rate, duration_s, users, extra, folder / name)
        for name, url in (("path", path_url), ("direct", direct_url))
    }
    return {name: _finish_load(proc, folder / name, duration_s) for name, proc in procs.items()}


def _start_load(
    url: str, rate: float | None, duration_s: float, users: int, extra: Sequence[str], out: Path
) -> subprocess.Popen[bytes]:
    """One ``pathprobe load``: open loop at ``rate`` requests/s, or closed loop (``rate`` None)."""
    out.mkdir(parents=True, exist_ok=True)
    arrival = ("--arrival", "constant", "--rate", f"{rate:g}") if rate is not None else ()
    args = [
        *(sys.executable, "-m", "pathprobe", "load", "--headless", "--only-summary", "-L", "WARNING", "-H", url),
        *(*arrival, "-u", str(users), "-r", str(users)),
        *("-t", f"{duration_s:g}s", "--out", str(out), "--tokenizer", "none", *extra),
    ]
    log = open(out / "load.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


def _finish_load(
    proc: subprocess.Popen[bytes], out: Path, duration_s: float
) -> tuple[list[dict[str, object]], dict[str, object]]:
    code = proc.wait(timeout=duration_s + 120)
    summary_path = out / "summary.json"
    if not summary_path.exists():
        tail = (out / "load.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"pathprobe load wrote no summary (exit {code}): {tail}")
    lines = (out / "records.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line], json.loads(summary_path.read_text())
