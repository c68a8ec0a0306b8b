"""Distributed runs: what workers and the master exchange, through Locust's messaging.

Each worker ships, with each of Locust's stats reports (``report_to_master`` /
``worker_report``), the records of the last interval plus their HDR histograms (encoded);
the master merges the histograms (exactly) and writes the records. When the test stops
each worker sends a final batch (:data:`MSG_FINAL`) with its own totals, and the master
waits for every worker's final batch before it writes its files. The master tells each
worker its share of an open-loop rate and its rank among the workers (:data:`MSG_SHARE`: a
``--trace`` replay gives worker ``rank`` of ``of`` the entries whose index is ``rank`` modulo
``of``, so each request is sent once) and, on a headless quit, to stop (:data:`MSG_STOP`); a
worker that has recorded its whole share of a trace says so (:data:`MSG_TRACE_DONE`) and the
master ends the run when every worker has.
"""

from __future__ import annotations

import logging
import time
from typing import Any, TypedDict

import gevent
from locust.env import Environment
from locust.rpc import Message
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner
from pathprobe.loadgen import hist
from pathprobe.loadgen import monitor as monitor_mod
from pathprobe.loadgen.outputs import write_outputs
from pathprobe.loadgen.records import Aggregator, Record, RouteWire
from pathprobe.loadgen.runtime import Runtime
from pathprobe.records import timing_only

log = logging.getLogger("pathprobe.loadgen")

MSG_FINAL = "pathprobe_final"
MSG_SHARE = "pathprobe_share"
MSG_STOP = "pathprobe_stop"
#: a worker has recorded its whole share of a --trace replay
MSG_TRACE_DONE = "pathprobe_trace_done"


class Delta(TypedDict):
    """A worker's records since its last report, and their histograms (encoded)."""

    hists: dict[str, RouteWire]
    records: list[Record]
    n: int


#: what a worker sends when it has nothing new
EMPTY_DELTA: Delta = {"hists": {}, "records": [], "n": 0}


# --- worker ----------------------------------------------------------------------------------
def install_worker(environment: Environment, rt: Runtime, runner: WorkerRunner) -> None:
    """Listen for the master's share and stop; ship each interval's records with Locust's report."""

    def on_share(environment: Environment, msg: Message, **_: object) -> None:
        rt.share = float(msg.data.get("share", 1.0))
        rt.rank = int(msg.data.get("rank", 0))
        rt.of = int(msg.data.get("of", 1))

    def trace_done() -> None:
        runner.send_message(MSG_TRACE_DONE, {"worker": rt.worker, "sent": rt.replay.total if rt.replay else 0})

    rt.on_trace_done = trace_done

    def on_stop(environment: Environment, msg: Message, **_: object) -> None:
        runner.stop()  # the environment's runner

    runner.register_message(MSG_SHARE, on_share)
    runner.register_message(MSG_STOP, on_stop, concurrent=True)

    def on_report(client_id: str, data: dict[str, object]) -> None:
        delta = take_delta(rt)
        if delta:
            data["pathprobe"] = delta

    environment.events.report_to_master.add_listener(on_report)


def take_delta(rt: Runtime) -> Delta | None:
    """The records since the last report and their histograms (encoded), or None when there are none."""
    batch = rt.agg.take_pending()
    if not batch:
        return None
    if rt.metrics is not None:
        rt.metrics.observe(batch)
    delta = Aggregator()
    delta.add_batch(batch)
    rt.worker_agg.merge(delta)
    wire = delta.to_wire()
    for r in delta.routes.values():  # reused by the next report instead of allocated again
        for h in r.hists.values():
            hist.recycle(h)
    if not rt.cfg.records:
        records: list[Record] = []
    else:  # trimmed here already: what timing detail leaves out never crosses to the master
        records = [timing_only(r) for r in batch] if rt.cfg.records_detail == "timing" else batch
    return {"hists": wire, "records": records, "n": len(batch)}


def send_final(rt: Runtime, runner: WorkerRunner) -> None:
    """The last batch, this worker's totals and loop monitor data; once per test."""
    if rt.final_sent:
        return
    rt.final_sent = True
    rt.end_wall = time.time()
    wire = rt.stop_monitor()
    d = take_delta(rt) or EMPTY_DELTA
    delta: dict[str, object] = {  # a Delta with the totals and loop monitor data
        "hists": d["hists"],
        "records": d["records"],
        "n": d["n"],
        "totals": rt.worker_agg.totals(),
        "worker": rt.worker,
        "client": wire,
    }
    if rt.tracing is not None:  # the spans out first: a summary on the master's disk means they were sent
        rt.tracing.shutdown()
        rt.tracing = None
    runner.send_message(MSG_FINAL, delta)
    try:  # this worker's own view, for checking the master's totals
        own = monitor_mod.merge_blocks({rt.worker: wire}, rt.cfg.lag_threshold_ms) if wire else None
        write_outputs(rt.cfg.out, rt.worker_agg, rt.meta(), name=f"worker-{rt.worker}", client=own)
    except OSError as exc:
        log.warning("pathprobe: cannot write worker summary: %s", exc)


# --- master ----------------------------------------------------------------------------------
def install_master(environment: Environment, rt: Runtime, runner: MasterRunner) -> None:
    """Merge every worker's interval batches and final batch."""

    def on_final(environment: Environment, msg: Message, **_: object) -> None:
        merge_from_worker(rt, msg.data)
        rt.finals[msg.node_id] = msg.data.get("totals", {})
        if msg.data.get("client"):
            rt.client_wires[str(msg.data.get("worker", msg.node_id))] = msg.data["client"]

    runner.register_message(MSG_FINAL, on_final)

    def on_trace_done(environment: Environment, msg: Message, **_: object) -> None:
        done = rt.trace_done_workers
        done.add(msg.node_id)
        active = {c.id for c in runner.clients.all if c.state != STATE_MISSING}
        if active <= done:
            done.clear()
            gevent.spawn(rt.end_run)

    runner.register_message(MSG_TRACE_DONE, on_trace_done)

    def on_worker_report(client_id: str, data: dict[str, Any]) -> None:  # Locust's report (msgpack, untyped)
        pp = data.get("pathprobe")
        if pp:
            merge_from_worker(rt, pp)

    environment.events.worker_report.add_listener(on_worker_report)


def merge_from_worker(rt: Runtime, data: Delta) -> None:
    rt.agg.merge_wire(data["hists"])
    if rt.writer is not None and data.get("records"):
        rt.writer(data["records"])


def send_shares(runner: MasterRunner) -> None:
    """Each connected worker runs an equal share of an open-loop rate, and a trace's entries of its rank."""
    workers = sorted(c.id for c in runner.clients.all if c.state != STATE_MISSING)
    n = max(1, len(workers))
    for rank, client_id in enumerate(workers):
        runner.send_message(MSG_SHARE, {"share": 1.0 / n, "rank": rank, "of": n}, client_id=client_id)


def master_collect(rt: Runtime, runner: MasterRunner) -> None:
    """Wait until every worker has sent its final batch."""
    expected = {c.id for c in runner.clients.all if c.state != STATE_MISSING}
    if runner.user_count > 0:
        # headless quit path: Locust fires test_stop before telling workers to stop
        runner.send_message(MSG_STOP)
    stop_timeout = float(getattr(rt.env, "stop_timeout", 0) or 0)
    deadline = time.monotonic() + stop_timeout + 30.0
    while not expected <= set(rt.finals) and time.monotonic() < deadline:
        gevent.sleep(0.05)
    missing = expected - set(rt.finals)
    if missing:
        log.error(
            "pathprobe: no final batch from worker(s) %s; totals exclude what they did not ship",
            ", ".join(sorted(missing)),
        )


def check_master_totals(rt: Runtime) -> None:
    total = rt.agg.totals()["requests"]
    workers = sum(int(t.get("requests", 0)) for t in rt.finals.values())
    if total != workers:
        log.error("pathprobe: master counted %d requests, workers reported %d", total, workers)
