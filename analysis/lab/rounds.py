"""The load runs of a compare, in order: a warm-up per configuration, then every round x
concurrency with the configurations in an order rotated per round (or their calls interleaved one
by one in a single load process), each run's CPU and accounting booked and its outcome logged.

Method: every configuration is warmed up first (its first request is reported as the cold start
and nothing from the warm-up enters the figures); then, for each round and each concurrency,
every configuration runs one ``pathprobe load`` of the same duration, in an order rotated per
round, so drift on a shared machine hits all configurations alike. A payload sweep
(``load.prompt_tokens`` / ``load.max_tokens`` lists) adds an axis like concurrency: every round x
concurrency x payload point runs each configuration once, into ``runs/NAME/c{C}-p{P}-m{M}/r{R}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pathprobe.analysis.lab.config import CompareConfig, Payload
from pathprobe.analysis.lab.loadrun import (
    RunResult,
    cpu_seconds,
    interleavable,
    rss_bytes,
    run_load,
    run_load_mixed,
    run_subdir,
)
from pathprobe.analysis.lab.paths import Path_
from pathprobe.analysis.lab.runaccounting import account, account_batch, scrape
from pathprobe.analysis.lab.stack import Stack
from pathprobe.analysis.report.figures import metric_values


def first_error(records: Sequence[Mapping[str, object]]) -> str:
    for r in records:
        if not r.get("ok") and r.get("status") != "STOPPED":
            return f"{r.get('status')}: {r.get('error')}"
    return "no request was sent"


def fail(p: Path_, reason: str) -> None:
    """Mark ``p`` failed with ``reason`` (the first reason stays)."""
    if p.status != "failed":
        p.status, p.reason = "failed", reason


def _at(res: RunResult) -> str:
    """``, payload p4096-m16`` for a sweep's run ('' otherwise)."""
    return f", payload {res.payload.key}" if res.payload is not None else ""


class Rounds:
    """The load runs of the live configurations; ``results`` and ``warmups`` hold what they gave."""

    def __init__(
        self,
        cfg: CompareConfig,
        stack: Stack,
        live: list[Path_],
        primary: str,
        prompt_file: Path | None,
        log: Callable[[str], None],
        prompt_files: Mapping[int, Path | None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.stack = stack
        self.live = live
        self.primary = primary  # the metric a run's p50 is logged in (e2e, or latency when open loop)
        self.prompt_file = prompt_file
        #: a payload sweep's prompt file per prompt size (cut once each); the primary's is ``prompt_file``
        self.prompt_files = dict(prompt_files or {})
        #: the payload points swept (None: one payload, the runs keyed by concurrency alone as before)
        self.points: list[Payload | None] = list(cfg.load.payloads) if cfg.load.swept else [None]
        self.log = log
        self.runs_dir = stack.out / "runs"
        self.traces_dir = stack.out / "traces" / "client"
        self.mixed = interleavable(cfg, live)
        self.results: dict[str, list[RunResult]] = {t.name: [] for t in cfg.enabled_targets}
        self.warmups: dict[str, RunResult] = {}
        self._n_runs = cfg.load.rounds * len(cfg.load.concurrency) * len(self.points)
        self._k = 0  # (round, concurrency) steps begun

    # ---------------------------------------------------------------- warm-up

    def warm_up(self) -> None:
        """One warm-up run per configuration (interleaved call by call when the rounds are); each
        path's memory at rest is read first."""
        for p in self.live:
            p.rss_rest = rss_bytes(p.procs)
        cfg = self.cfg
        if cfg.load.warmup_s <= 0:
            return
        conc = max(cfg.load.concurrency)

        def alone(p: Path_) -> RunResult:
            return run_load(
                cfg,
                p,
                conc,
                -1,
                cfg.load.warmup_s,
                self.runs_dir / p.name / "warmup",
                None,
                self.prompt_file,
                self.stack.placement,
            )

        if self.mixed:
            warm = run_load_mixed(
                cfg, self.live, conc, -1, cfg.load.warmup_s, self.runs_dir, None, self.prompt_file, self.stack.placement
            )
            for p in self.live:
                # long calls (a 2048-token stream: ~0.5 s) and many configurations: the interleaved
                # warm-up can end before a cycle reached every configuration; one it did not reach
                # gets a warm-up of its own rather than failing for a call that was never sent
                if not warm[p.name].error and not warm[p.name].records:
                    self.log(f"warm-up {p.name}: not reached by the interleaved warm-up, warmed alone")
                    warm[p.name] = alone(p)
        else:
            warm = {p.name: alone(p) for p in self.live}
        for p in self.live:
            res = warm[p.name]
            self.warmups[p.name] = res
            ok = [r for r in res.records if r.get("ok")]
            if res.error or not ok:
                fail(p, f"warm-up: {res.error or first_error(res.records)}")
            self.log(f"warm-up {p.name}: {len(ok)} ok of {len(res.records)}")

    # ---------------------------------------------------------------- measured rounds

    def measure(self) -> None:
        """Every round x concurrency (x payload point), each configuration once."""
        for rnd in range(self.cfg.load.rounds):
            for ci, conc in enumerate(self.cfg.load.concurrency):
                for pi, point in enumerate(self.points):
                    self._k += 1
                    self._step(rnd, ci + pi, conc, point)

    def _prompts(self, point: Payload | None) -> Path | None:
        """The prompt file of a payload point (the primary one's when not swept)."""
        if point is None or point.prompt_tokens not in self.prompt_files:
            return self.prompt_file
        return self.prompt_files[point.prompt_tokens]

    def _order(self, rnd: int, ci: int) -> list[Path_]:
        """The configurations still ok, rotated by round and concurrency; one whose process (or the
        shared server) has exited is failed here."""
        order = [p for p in self.live if p.status == "ok"]
        if not order:
            return []
        shift = (rnd + ci) % len(order)
        order = order[shift:] + order[:shift]
        server = self.stack.server
        for p in order:
            dead = p.dead() or (server if server and server.exit_code() is not None else None)
            if dead is not None:
                fail(p, f"{dead.name} exited with code {dead.exit_code()} before round {rnd + 1}: {dead.tail()}")
        return [p for p in order if p.status == "ok"]

    def _traces_file(self, name: str, conc: int, rnd: int, point: Payload | None = None) -> Path | None:
        return self.traces_dir / f"{name}-{run_subdir(conc, point)}-r{rnd}.jsonl" if self.cfg.tracing else None

    def _step(self, rnd: int, ci: int, conc: int, point: Payload | None = None) -> None:
        order = self._order(rnd, ci)
        # CPU of each path's own processes (they serve only its requests, interleaved or not)
        cpu0 = {p.name: cpu_seconds(p.procs) for p in order}
        batch = self._interleaved(order, conc, rnd, point) if self.mixed and len(order) > 1 else {}
        for p in order:
            if p.name in batch:
                res = batch[p.name]
            else:
                cpu0[p.name] = cpu_seconds(p.procs)
                res = self._alone(p, conc, rnd, point)
            self._book(p, res, cpu0[p.name], rnd, conc)

    def _interleaved(
        self, order: list[Path_], conc: int, rnd: int, point: Payload | None = None
    ) -> dict[str, RunResult]:
        """One load process for every configuration, calls interleaved one by one."""
        tf = self._traces_file("interleaved", conc, rnd, point)
        before = {p.name: scrape(self.stack, p) for p in order}
        cfg = self.cfg
        batch = run_load_mixed(
            cfg,
            order,
            conc,
            rnd,
            cfg.load.duration_s,
            self.runs_dir,
            tf,
            self._prompts(point),
            self.stack.placement,
            payload=point,
        )
        account_batch(self.stack, order, before, batch)
        return batch

    def _alone(self, p: Path_, conc: int, rnd: int, point: Payload | None = None) -> RunResult:
        """One load run of configuration ``p`` alone, its accounting set against its records."""
        run_dir = self.runs_dir / p.name / run_subdir(conc, point) / f"r{rnd}"
        before = scrape(self.stack, p)  # accounting: one path per run, so its counters are its own
        res = run_load(
            self.cfg,
            p,
            conc,
            rnd,
            self.cfg.load.duration_s,
            run_dir,
            self._traces_file(p.name, conc, rnd, point),
            self._prompts(point),
            self.stack.placement,
            payload=point,
        )
        res.accounting = account(self.stack, p, before, res, run_dir)
        return res

    def _book(self, p: Path_, res: RunResult, cpu_before: float | None, rnd: int, conc: int) -> None:
        """Keep the run's result, its path CPU; fail the configuration on a dead process, a load
        error or no successful request; log the run."""
        cpu1 = cpu_seconds(p.procs)
        rss = rss_bytes(p.procs)
        if rss is not None:
            p.rss_load = max(rss, p.rss_load or 0)
        if cpu_before is not None and cpu1 is not None:
            res.path_cpu_s = cpu1 - cpu_before
            (res.out_dir / "path_cpu.json").write_text(json.dumps({"cpu_s": res.path_cpu_s}))
        self.results[p.name].append(res)
        ok = [r for r in res.records if r.get("ok")]
        dead = p.dead()
        if dead is not None:
            fail(
                p,
                f"{dead.name} exited with code {dead.exit_code()} during round {rnd + 1}, "
                f"concurrency {conc}: {dead.tail()}",
            )
        elif res.error:
            fail(p, f"round {rnd + 1}, concurrency {conc}{_at(res)}: {res.error}")
        elif not ok:
            fail(p, f"round {rnd + 1}, concurrency {conc}{_at(res)}: every request failed: {first_error(res.records)}")
        self._log_run(p, res, rnd, conc)

    def _log_run(self, p: Path_, res: RunResult, rnd: int, conc: int) -> None:
        import numpy as np

        ok = [r for r in res.records if r.get("ok")]
        failed = [r for r in res.records if not r.get("ok") and r.get("status") != "STOPPED"]
        vals = metric_values([r for r in ok if r.get("split")], self.primary)
        p50 = f"{float(np.median(vals)):.3f} ms" if vals else "–"
        point = f" {res.payload.key}" if res.payload is not None else ""
        self.log(
            f"[{self._k}/{self._n_runs}] round {rnd + 1} c={conc}{point} {p.name}: {len(ok)} ok, "
            f"{len(failed)} err, p50 {p50}"
            + (f"  FAILED: {p.reason}" if p.status == "failed" else "")
            + (f"  CLIENT SATURATED: {res.client.get('reason')}" if res.client and res.client.get("saturated") else "")
            + (
                f"  ACCOUNTING: {res.accounting['unexplained']} unexplained difference(s)"
                if res.accounting and res.accounting["unexplained"]
                else ""
            )
        )
