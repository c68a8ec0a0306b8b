"""compare's frontier phase (``frontier:`` in the config): after the measured rounds, each chosen
configuration's throughput frontier (:mod:`pathprobe.analysis.lab.frontier`) against the direct
path of its own client protocol, both offered the same load at the same time by load processes of
their own, at every step.

- **unary**: open-loop request rates (constant spacing, ``users`` calls in flight at most), stepped
  up geometrically from ``start_rps`` to where the added p99 (from the scheduled send: a call that
  waited for a free user counts the wait) crosses the largest bound or errors appear, then each
  bound's knee bisected;
- **stream**: concurrent streams of ``chunks`` chunks paced by the server, up to where the added
  inter-chunk gap p99 crosses ``bound_ms``.

Every point keeps both load processes' health; a point where either saturated is refused (kept
with its reason, never a figure) and the search stops there. Beside each point: the path's own
processes' CPU per request and RSS (a direct path has none of its own: the server is shared).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pathprobe.analysis.lab import frontier as fr
from pathprobe.analysis.lab.config import CompareConfig, FrontierConfig
from pathprobe.analysis.lab.loadrun import RunResult, cpu_seconds, rss_bytes, run_load
from pathprobe.analysis.lab.paths import Path_
from pathprobe.analysis.lab.placement import Placement

METHOD = (
    "per configuration, the path and the direct path of its client protocol offered the same load at the same "
    "time by two load processes; unary: open-loop constant-spacing rates, added p99 of latency from the "
    "scheduled send; streams: closed-loop concurrent streams paced by the server, added inter-chunk gap p99. "
    "Rates step up by 'growth' until the largest bound is crossed or errors appear, then each bound's knee is "
    "bisected to 'tolerance'. A step where either load process saturated is refused and ends the search. "
    "CPU per request and RSS: the configuration's own processes."
)


def pairs_for(cfg: FrontierConfig, live: list[Path_]) -> list[tuple[Path_, Path_]]:
    """Each chosen configuration with the first live direct path of its client protocol."""
    directs: dict[str, Path_] = {}
    for p in live:
        if p.target.kind == "direct" and p.status == "ok" and p.target.protocol not in directs:
            directs[p.target.protocol or ""] = p
    chosen = [p for p in live if p.status == "ok" and p not in directs.values()]
    if cfg.targets is not None:
        chosen = [p for p in chosen if p.name in cfg.targets]
    return [(p, directs[p.target.protocol or ""]) for p in chosen if (p.target.protocol or "") in directs]


class FrontierRun:
    """The frontier phase of one compare; :meth:`run` returns the report's ``frontier`` block."""

    def __init__(
        self,
        cfg: CompareConfig,
        out: Path,
        placement: Placement | None,
        prompt_file: Path | None,
        log: Callable[[str], None],
    ) -> None:
        assert cfg.frontier is not None
        self.cfg, self.fc, self.out = cfg, cfg.frontier, out / "frontier"
        self.placement, self.prompt_file, self.log = placement, prompt_file, log

    def run(self, live: list[Path_]) -> dict[str, object]:
        fc = self.fc
        targets: dict[str, object] = {}
        for path, direct in pairs_for(fc, live):
            entry: dict[str, object] = {"against": direct.name}
            if fc.unary:
                entry["unary"] = self._search(path, direct, "unary")
            if fc.stream is not None:
                entry["stream"] = self._search(path, direct, "stream")
            targets[path.name] = entry
        return {
            "bounds_ms": fc.bounds_ms,
            "stream_bound_ms": fc.stream.bound_ms if fc.stream else None,
            "config": fc.model_dump(mode="json"),
            "method": METHOD,
            "targets": targets,
        }

    def _search(self, path: Path_, direct: Path_, kind: str) -> dict[str, object]:
        fc, st = self.fc, self.fc.stream

        def measure(load: float) -> fr.Point:
            point = self._step(path, direct, kind, load)
            added = "–" if point.added_p99_ms is None else f"{point.added_p99_ms:+.2f} ms"
            refused = f" REFUSED ({point.reason})" if point.client_saturated else ""
            self.log(f"frontier {path.name} {kind} {load:g}: added p99 {added}, errors {point.errors}{refused}")
            return point

        if kind == "unary":
            found = fr.search(
                measure, fc.bounds_ms, start=fc.start_rps, limit=fc.max_rps, growth=fc.growth, tolerance=fc.tolerance
            )
        else:
            assert st is not None
            found = fr.search(
                measure, [st.bound_ms], start=st.start, limit=st.max_streams, growth=fc.growth,
                tolerance=fc.tolerance, quantum=1.0,
            )  # fmt: skip
        return as_dict(found)

    def _step(self, path: Path_, direct: Path_, kind: str, load: float) -> fr.Point:
        """One load, the path and its direct path at the same time; the path's CPU and RSS beside it."""
        fc = self.fc
        stream = kind == "stream" and fc.stream is not None
        sub = self._config(kind, load)
        users = int(load) if stream else fc.users
        secs = fc.warmup_s + ((fc.stream.duration_s if fc.stream else 0) if stream else fc.duration_s)
        folder = self.out / path.name / f"{kind}-{load:g}"
        cpu0 = cpu_seconds(path.procs)

        def one(name: str, p: Path_) -> RunResult:
            label = f"frontier {path.name} {kind} {load:g} {name}"
            return run_load(sub, p, users, -1, secs, folder / name, None, self.prompt_file, self.placement, None, label)

        with ThreadPoolExecutor(2) as pool:
            futures = {name: pool.submit(one, name, p) for name, p in (("path", path), ("direct", direct))}
            res: dict[str, RunResult] = {name: f.result() for name, f in futures.items()}
        cpu1 = cpu_seconds(path.procs)
        failed = [f"{name}: {r.error}" for name, r in res.items() if r.error]
        if failed:
            return fr.Point(load, None, None, 0, 1, reason="; ".join(failed))
        runs: dict[str, fr.Run] = {
            n: ([dict(x) for x in r.records], {"client": r.client or {}}) for n, r in res.items()
        }
        point = fr.point_from_runs(load, runs, fc.warmup_s, fr.gap_values if stream else fr.latency_values)
        n = len(res["path"].records)
        cpu = (cpu1 - cpu0) * 1000.0 / n if cpu0 is not None and cpu1 is not None and n else None
        rss = rss_bytes(path.procs)
        return dataclasses.replace(point, cpu_ms_per_request=cpu, rss_mb=None if rss is None else rss / 2**20)

    def _config(self, kind: str, load: float) -> CompareConfig:
        """compare's config with the load of one step: open loop at ``load`` req/s, or ``load`` streams."""
        fc = self.fc
        if kind == "stream" and fc.stream is not None:
            chunks = fc.stream.chunks
            change: dict[str, object] = {"arrival": "closed", "rate": None, "stream": True, "max_tokens": chunks}
        else:
            change = {"arrival": "constant", "rate": load, "stream": False, "max_tokens": fc.max_tokens}
        return self.cfg.model_copy(update={"load": self.cfg.load.model_copy(update=change)})


def as_dict(found: fr.Frontier) -> dict[str, object]:
    """One search as the report keeps it: knees, points in load order, refused points, the note."""
    return {
        "knees": [dataclasses.asdict(k) for k in found.knees],
        "points": [dataclasses.asdict(p) for p in found.points],
        "refused": [dataclasses.asdict(p) for p in found.refused],
        "note": found.note,
    }
