"""pathprobe's Locust event listeners: what happens at init, test start / stop and quit.

:func:`attach` hooks them onto an ``Events`` object (:mod:`pathprobe.loadgen.plugin` does it
for Locust's global ``events`` on import). Each listener finds the environment's
:class:`~pathprobe.loadgen.runtime.Runtime` and drives it; distributed runs add the
messaging of :mod:`pathprobe.loadgen.distributed`.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from locust.env import Environment
from locust.event import Events
from locust.runners import MasterRunner, WorkerRunner
from pathprobe import environment as env_vars
from pathprobe.loadgen import distributed
from pathprobe.loadgen import monitor as monitor_mod
from pathprobe.loadgen.outputs import format_table
from pathprobe.loadgen.runtime import find, runtime

log = logging.getLogger("pathprobe.loadgen")


def on_init(environment: Environment, **_kw: object) -> None:
    """Prompts and metrics endpoint before the clock runs; the messaging of a distributed run; the web view."""
    if getattr(environment.parsed_options, "sweep", "") and not env_vars.get(env_vars.PATHPROBE_SWEEP_CHILD):
        log.warning("pathprobe: --sweep is handled by `pathprobe load`; ignored here")
    rt = runtime(environment)
    runner = environment.runner
    if not isinstance(runner, MasterRunner):
        rt.prepare()  # tokenizer + prompts now, not inside the timed run
        rt.serve_metrics()
    elif rt.cfg.metrics_port:
        log.warning(
            "pathprobe: --metrics-port is served by the processes that run users (the workers); the master serves none"
        )
    if isinstance(runner, MasterRunner):
        distributed.install_master(environment, rt, runner)
    elif isinstance(runner, WorkerRunner):
        distributed.install_worker(environment, rt, runner)
    if environment.web_ui is not None:
        from pathprobe.loadgen import webview

        webview.install(environment, rt)


def on_test_start(environment: Environment, **_kw: object) -> None:
    """A fresh aggregate, output files and monitors for this test (Locust may run several)."""
    rt = runtime(environment)
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        distributed.send_shares(runner)
    rt.start_test()


def on_test_stopping(environment: Environment, **_kw: object) -> None:
    """Users are about to be stopped: stop sampling the loop (the shutdown is not load)."""
    rt = find(environment)
    if rt is not None and rt.monitor is not None:
        rt.monitor.stop()


def on_test_stop(environment: Environment, **_kw: object) -> None:
    """Workers ship their last batch; the master waits for every worker's; then the files are written."""
    rt = runtime(environment)
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        distributed.send_final(rt, runner)
        if rt.metrics is not None:
            rt.metrics.flush()
    elif isinstance(runner, MasterRunner):
        distributed.master_collect(rt, runner)
        rt.end_wall = time.time()
        rt.write_summary()
        distributed.check_master_totals(rt)
    else:
        rt.stop_test_local()
        if rt.metrics is not None:
            rt.metrics.flush()
        if rt.tracing is not None:
            rt.tracing.shutdown()
            rt.tracing = None


def on_quitting(environment: Environment, **_kw: object) -> None:
    """A headless run ends with the per-route split table (and the saturation warnings)."""
    rt = find(environment)
    if rt is not None and rt.metrics is not None:
        rt.metrics.close()
    if rt is None or rt.role == "worker":
        return
    if rt.last_summary is not None and getattr(environment.parsed_options, "headless", False):
        print(f"\npathprobe: per-route latency split (ms), files in {os.path.abspath(rt.cfg.out)}", file=sys.stdout)
        print(format_table(rt.last_summary), file=sys.stdout)
        client = rt.last_summary.get("client")
        if client:
            print(monitor_mod.format_line(client), file=sys.stdout)
            for line in monitor_mod.warning_lines(client):
                print(line, file=sys.stdout)
        sys.stdout.flush()


def attach(ev: Events) -> None:
    """Hook pathprobe onto an ``Events`` object (done for Locust's global ``events`` on import;
    call it yourself for an ``Environment`` built with its own ``Events()``)."""
    if getattr(ev, "_pathprobe_attached", False):
        return
    ev.init.add_listener(on_init)
    ev.test_start.add_listener(on_test_start)
    ev.test_stop.add_listener(on_test_stop)
    if hasattr(ev, "test_stopping"):
        ev.test_stopping.add_listener(on_test_stopping)
    ev.quitting.add_listener(on_quitting)
    ev._pathprobe_attached = True  # type: ignore[attr-defined]  # our marker on Locust's object
