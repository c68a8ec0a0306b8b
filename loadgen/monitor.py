"""Is the load generator itself the bottleneck? Event-loop lag and CPU of each Locust process.

Every measured duration on the client starts and ends inside a gevent greenlet. When the
process's one event loop is busy (too many users, streams or spans for one core), a
response that has arrived waits for the loop before its greenlet reads the clock: that
wait lands in the request's e2e and, since no hop reports it, in **network hop 1**
(client <-> first hop). This module measures that wait directly so the run can say so.

- **loop lag**: one greenlet sleeps ``INTERVAL_S`` (5 ms) again and again and records how
  late it wakes (µs, HDR histogram like every other histogram of the run). A sleeping
  greenlet is woken by the same loop that wakes request greenlets, so its lateness is the
  scheduling delay a response sees before it is timed.
- **wait lag**: the part of each late wake-up during which the event-loop thread was ready
  to run but had no core: ``min(lag, run-queue wait during the sample)``, the kernel's own
  count of it (``/proc/thread-self/schedstat``, second field). That is the machine's other
  processes (the engine's threads on a small box, other jobs), not this process's load.
- **busy lag**: the part of each late wake-up during which the event-loop thread was
  itself running, after the wait: the thread's CPU time during the sample, spread over the
  sample's time not waiting for a core, in the share that fell after the deadline
  (``cpu x (lag - wait) / (interval + lag - wait)``, at most ``lag - wait``). Lag with a
  busy loop thread means this process has more work than one core does in time -- the
  case that more processes or workers fix. Without the wait taken out first, a starved
  loop that did a little work during the sleep (reading a response) had that work counted
  as the cause of a lateness the run queue caused (2026-12-02: busy lag p99 6.7 ms with
  the loop at 13 % of a core). Without schedstat (not Linux) the wait is 0.
- **CPU**: per second, the CPU time of the event-loop thread (``time.thread_time`` in the
  greenlet, i.e. the main thread that runs every greenlet) and of the whole process
  (``time.process_time``, gRPC's own threads included), as percent of one core.

**Saturated** (``client.saturated`` in summary.json, with ``reason``) when the loop thread's
mean CPU is >= 90 % of one core (nothing left to absorb bursts; lag grows with load), or
the whole process's is (gRPC's own threads deliver stream messages and need the same GIL:
a message can wait there without the loop timer seeing it), or the busy lag p99 is >=
``--client-lag-threshold-ms`` (default 5 ms: an idle loop wakes
0.1-1 ms late (epoll's millisecond timeout), and on loopback the whole network segment is
1-10 ms, so 5 ms of the client's own waiting at p99 is as large as what is being measured).
**Contended** (``client.contended``, a note, not saturation) when the total lag p99 is over
the threshold but the loop was not busy: the machine's CPU is shared; hop 1 includes that
waiting too (in an interleaved run both calls of a pair see it), and more load processes on
the same cores would not help.

Cost: one timer wake-up per 5 ms (about 10-20 µs of CPU each: < 0.5 % of a core).
Sampling stops when Locust starts stopping users (``test_stopping``), so the shutdown
itself is not booked as lag. The 5 ms period gives ~200 samples a second, so a short
run's p99 is not decided by one or two one-off stalls (start-up, a GC pass).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, TypedDict

from pathprobe.loadgen import hist

if TYPE_CHECKING:
    import gevent

INTERVAL_S = 0.005
CPU_WINDOW_S = 1.0
CPU_SATURATED_PCT = 90.0
DEFAULT_LAG_THRESHOLD_MS = 5.0
#: the kernel's per-thread scheduler counters: run time, run-queue wait (ns), time slices
SCHEDSTAT = "/proc/thread-self/schedstat"
WARNING_TEXT = "client saturated: network hop 1 includes client-side waiting; use --processes N or more workers"
CONTENDED_TEXT = (
    "client contended: its event loop waited for a CPU (other processes on this machine); "
    "network hop 1 includes that waiting"
)


class LoopMonitor:
    """One greenlet per process: loop lag into HDR histograms, CPU per 1 s window."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.lag = hist.new_histogram()
        self.busy = hist.new_histogram()
        self.wait = hist.new_histogram()
        self.lag_sum_ms = 0.0
        self.busy_sum_ms = 0.0
        self.wait_sum_ms = 0.0
        self.cpu_windows: list[float] = []  # loop thread, % of one core, per window
        self.proc_windows: list[float] = []  # whole process
        self.cpu_total_s = 0.0
        self.proc_total_s = 0.0
        self.wall_total_s = 0.0
        self._glet: gevent.Greenlet | None = None
        self._w0: tuple[float, float, float] | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> LoopMonitor:
        import gevent

        self.stop()
        self._glet = gevent.spawn(self._run)
        return self

    def stop(self) -> None:
        """Ends the greenlet and books the partial CPU window. Idempotent."""
        if self._glet is not None:
            self._glet.kill(block=True)
            self._glet = None
        self._close_window(final=True)

    def _close_window(self, final: bool = False) -> None:
        # runs in the gevent thread (the monitor greenlet, or a Locust event listener), so
        # thread_time is the event-loop thread's clock
        if self._w0 is None:
            return
        w_wall, w_cpu, w_proc = self._w0
        now = (time.perf_counter(), time.thread_time(), time.process_time())
        self._w0 = None if final else now
        wall, cpu, proc = now[0] - w_wall, now[1] - w_cpu, now[2] - w_proc
        if wall <= 0:
            return
        self.cpu_total_s += cpu
        self.proc_total_s += proc
        self.wall_total_s += wall
        if wall >= CPU_WINDOW_S / 2:  # a short tail window is in the mean, not in the max
            self.cpu_windows.append(100.0 * cpu / wall)
            self.proc_windows.append(100.0 * proc / wall)

    def _run(self) -> None:
        import gevent

        loop = gevent.get_hub().loop
        pc, tt = time.perf_counter, time.thread_time
        self._w0 = (pc(), tt(), time.process_time())
        next_window = pc() + CPU_WINDOW_S
        interval = self.interval_s
        waited = RunQueueWait()  # opened here: the event-loop thread's own counters
        try:
            while True:
                loop.update_now()  # the timer counts from now, not from the loop's cached time
                t0, c0, q0 = pc(), tt(), waited.ms()
                gevent.sleep(interval)
                t1, c1, q1 = pc(), tt(), waited.ms()
                self._record(max(0.0, (t1 - t0 - interval) * 1e3), (c1 - c0) * 1e3, q1 - q0)
                if t1 >= next_window:
                    self._close_window()
                    next_window = t1 + CPU_WINDOW_S
        finally:
            waited.close()

    def _record(self, lag_ms: float, cpu_ms: float, wait_ms: float) -> None:
        """One sample: its lag, the part waiting for a core, the part the loop itself was running.

        The loop's CPU time of the sample is spread over the time it was not waiting for a core; the
        share that fell after the deadline is its busy lag (counting all of it, as before, made a long
        starved sample -- 60 ms late at 10 % of a core -- look 5 ms busy)."""
        wait_ms = min(lag_ms, max(0.0, wait_ms))
        late = lag_ms - wait_ms  # late, and not for want of a core
        awake = self.interval_s * 1e3 + late  # the sample's time not waiting for a core
        busy_ms = min(late, max(0.0, cpu_ms) * late / awake) if awake > 0 else 0.0
        self.lag.record_value(round(lag_ms * 1000.0))
        self.busy.record_value(round(busy_ms * 1000.0))
        self.wait.record_value(round(wait_ms * 1000.0))
        self.lag_sum_ms += lag_ms
        self.busy_sum_ms += busy_ms
        self.wait_sum_ms += wait_ms

    # -- results --------------------------------------------------------------------------
    def to_wire(self) -> MonitorWire:
        """What a worker ships to the master (histograms encoded, merged exactly there)."""
        return {
            "lag_hist": hist.encode(self.lag) if self.lag.get_total_count() else "",
            "busy_hist": hist.encode(self.busy) if self.busy.get_total_count() else "",
            "wait_hist": hist.encode(self.wait) if self.wait.get_total_count() else "",
            "lag_sum_ms": self.lag_sum_ms,
            "busy_sum_ms": self.busy_sum_ms,
            "wait_sum_ms": self.wait_sum_ms,
            "cpu_total_s": self.cpu_total_s,
            "proc_total_s": self.proc_total_s,
            "wall_total_s": self.wall_total_s,
            "cpu_windows": list(self.cpu_windows),
            "proc_windows": list(self.proc_windows),
        }


class RunQueueWait:
    """The calling thread's run-queue wait so far (ms), from the kernel's schedstat; 0 where there is none."""

    def __init__(self, path: str = SCHEDSTAT) -> None:
        import os

        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:
            self._fd = None

    def ms(self) -> float:
        import os

        if self._fd is None:
            return 0.0
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) / 1e6
        except (OSError, IndexError, ValueError):
            return 0.0

    def close(self) -> None:
        import os

        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _pct(x: float) -> float:
    return round(x, 1)


class LagStats(TypedDict):
    """Event-loop lag over a run (ms); None without samples."""

    p50: float | None
    p99: float | None
    max: float | None
    mean: float | None
    samples: int


class MonitorWire(TypedDict, total=False):
    """One process's loop monitor data as a worker ships it (histograms encoded)."""

    lag_hist: str
    busy_hist: str
    wait_hist: str
    lag_sum_ms: float
    busy_sum_ms: float
    wait_sum_ms: float
    cpu_total_s: float
    proc_total_s: float
    wall_total_s: float
    cpu_windows: list[float]
    proc_windows: list[float]


class CpuPercent(TypedDict):
    """CPU over a run, % of one core: the event loop's thread, then the whole process."""

    mean: float | None
    max: float | None
    process_mean: float | None
    process_max: float | None


CpuKey = Literal["mean", "max", "process_mean", "process_max"]


class ClientBlock(TypedDict, total=False):
    """The run's (or one process's) ``client`` block: loop lag, CPU and the saturation verdict."""

    loop_lag_ms: LagStats
    loop_busy_lag_ms: LagStats
    loop_wait_lag_ms: LagStats
    cpu_percent: CpuPercent
    saturated: bool
    reason: str | None
    contended: bool
    contended_reason: str | None
    lag_threshold_ms: float
    cpu_threshold_percent: float
    process: str
    processes: list[ClientBlock]


def _lag_stats(encoded: list[str], total_ms: float) -> LagStats:
    h = hist.new_histogram()
    for e in encoded:
        if e:
            hist.decode_into(h, e)
    n = h.get_total_count()
    if not n:
        return {"p50": None, "p99": None, "max": None, "mean": None, "samples": 0}
    pct = hist.percentiles(h, (50.0, 99.0))
    return {
        "p50": pct[50.0] / 1000.0,
        "p99": pct[99.0] / 1000.0,
        "max": h.get_max_value() / 1000.0,
        "mean": round(total_ms / n, 4),
        "samples": n,
    }


def _judge(block: ClientBlock, lag_threshold_ms: float) -> None:
    lag, busy, cpu = block["loop_lag_ms"], block["loop_busy_lag_ms"], block["cpu_percent"]
    reasons = []
    if cpu["mean"] is not None and cpu["mean"] >= CPU_SATURATED_PCT:
        reasons.append(f"event-loop CPU {cpu['mean']:.0f}% of one core (mean; >= {CPU_SATURATED_PCT:.0f}%)")
    elif cpu["process_mean"] is not None and cpu["process_mean"] >= CPU_SATURATED_PCT:
        reasons.append(
            f"process CPU {cpu['process_mean']:.0f}% of one core (mean, gRPC's threads included; "
            f">= {CPU_SATURATED_PCT:.0f}%: Python work in every thread shares one GIL)"
        )
    if busy["p99"] is not None and busy["p99"] >= lag_threshold_ms:
        reasons.append(
            f"event-loop lag p99 {lag['p99']:.1f} ms, {busy['p99']:.1f} ms of it with the loop busy "
            f"(>= {lag_threshold_ms:g} ms)"
        )
    block["saturated"] = bool(reasons)
    block["reason"] = "; ".join(reasons) if reasons else None
    contended = not reasons and lag["p99"] is not None and lag["p99"] >= lag_threshold_ms
    block["contended"] = contended
    wait = block.get("loop_wait_lag_ms")
    w = wait["p99"] if wait is not None else None
    waited = f", waiting for a core p99 {w:.1f} ms" if w is not None else ""
    block["contended_reason"] = (
        f"event-loop lag p99 {lag['p99']:.1f} ms while the loop itself was mostly idle "
        f"(busy lag p99 {busy['p99']:.1f} ms{waited}; loop CPU {cpu['mean'] or 0:.0f}% of one core)"
        if contended
        else None
    )
    block["lag_threshold_ms"] = lag_threshold_ms
    block["cpu_threshold_percent"] = CPU_SATURATED_PCT


def block_from_wire(
    wire: MonitorWire, lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS, name: str | None = None
) -> ClientBlock:
    """One process's ``client`` block: loop lag p50/p99/max (ms), CPU mean/max (% of one core)."""
    wall = wire.get("wall_total_s") or 0.0
    win = wire.get("cpu_windows") or []
    pwin = wire.get("proc_windows") or []
    block: ClientBlock = {
        "loop_lag_ms": _lag_stats([wire.get("lag_hist", "")], wire.get("lag_sum_ms", 0.0)),
        "loop_busy_lag_ms": _lag_stats([wire.get("busy_hist", "")], wire.get("busy_sum_ms", 0.0)),
        "loop_wait_lag_ms": _lag_stats([wire.get("wait_hist", "")], wire.get("wait_sum_ms", 0.0)),
        "cpu_percent": {
            "mean": _pct(100.0 * wire.get("cpu_total_s", 0.0) / wall) if wall > 0 else None,
            "max": _pct(max(win)) if win else None,
            "process_mean": _pct(100.0 * wire.get("proc_total_s", 0.0) / wall) if wall > 0 else None,
            "process_max": _pct(max(pwin)) if pwin else None,
        },
    }
    _judge(block, lag_threshold_ms)
    if name is not None:
        block["process"] = name
    return block


def merge_blocks(
    wires: dict[str, MonitorWire], lag_threshold_ms: float = DEFAULT_LAG_THRESHOLD_MS
) -> ClientBlock | None:
    """The run's ``client`` block from every load process's wire data.

    Loop lag: the processes' histograms merged exactly (p99 over every sample of every
    process). CPU is per process (each has its own loop and core): mean = the average of
    the processes' means, max = the highest 1 s window of any. Saturated (contended) when
    any process is; ``reason`` names which and why; ``processes`` has each one's block.
    """
    wires = {k: v for k, v in wires.items() if v}
    if not wires:
        return None
    per = {name: block_from_wire(w, lag_threshold_ms, name) for name, w in sorted(wires.items())}
    if len(per) == 1:
        only = next(iter(per.values())).copy()
        only["processes"] = list(per.values())
        return only
    ws = list(wires.values())
    cpus = [b["cpu_percent"] for b in per.values()]

    def agg(key: CpuKey, fn: Callable[[list[float]], float]) -> float | None:
        vals = [v for c in cpus if (v := c[key]) is not None]
        return _pct(fn(vals)) if vals else None

    merged: ClientBlock = {
        "loop_lag_ms": _lag_stats([w.get("lag_hist", "") for w in ws], sum(w.get("lag_sum_ms", 0.0) for w in ws)),
        "loop_busy_lag_ms": _lag_stats(
            [w.get("busy_hist", "") for w in ws], sum(w.get("busy_sum_ms", 0.0) for w in ws)
        ),
        "loop_wait_lag_ms": _lag_stats(
            [w.get("wait_hist", "") for w in ws], sum(w.get("wait_sum_ms", 0.0) for w in ws)
        ),
        "cpu_percent": {
            "mean": agg("mean", lambda v: sum(v) / len(v)),
            "max": agg("max", max),
            "process_mean": agg("process_mean", lambda v: sum(v) / len(v)),
            "process_max": agg("process_max", max),
        },
    }
    _judge(merged, lag_threshold_ms)
    sat = [b for b in per.values() if b["saturated"]]
    con = [b for b in per.values() if b["contended"]]
    merged["saturated"] = bool(sat)
    merged["reason"] = "; ".join(f"worker {b['process']}: {b['reason']}" for b in sat) if sat else None
    merged["contended"] = not sat and bool(con)
    merged["contended_reason"] = (
        "; ".join(f"worker {b['process']}: {b['contended_reason']}" for b in con) if merged["contended"] else None
    )
    merged["processes"] = list(per.values())
    return merged


def format_line(block: ClientBlock) -> str:
    lag, busy, cpu = block["loop_lag_ms"], block["loop_busy_lag_ms"], block["cpu_percent"]

    def f(v: float | None, d: int = 3) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    n = len(block.get("processes") or []) or 1
    return (
        f"client ({n} load process{'es' if n > 1 else ''}): event-loop lag p50 {f(lag['p50'])} ms, "
        f"p99 {f(lag['p99'])} ms (busy {f(busy['p99'])} ms), max {f(lag['max'])} ms; "
        f"loop CPU mean {f(cpu['mean'], 0)}%, max {f(cpu['max'], 0)}% of one core "
        f"(whole process {f(cpu.get('process_mean'), 0)}%)"
    )


def warning_lines(block: ClientBlock | None) -> list[str]:
    """The WARNING / NOTE lines a headless run prints at its end."""
    if not block:
        return []
    if block["saturated"]:
        return [f"WARNING: {WARNING_TEXT} ({block['reason']})"]
    if block.get("contended"):
        return [f"NOTE: {CONTENDED_TEXT} ({block['contended_reason']})"]
    return []
