"""pathprobe's Locust plugin: importing this module hooks pathprobe onto Locust.

Imported by :mod:`pathprobe.loadgen.users` (so a locustfile that uses pathprobe's users gets
it). Everything goes through Locust's extension points, each job in a module of its own:

- :mod:`~pathprobe.loadgen.flags`: the command-line flags (``init_command_line_parser``);
- :mod:`~pathprobe.loadgen.config`: :class:`Config`, built from flags and environment;
- :mod:`~pathprobe.loadgen.tracing`: the CLIENT span of each request;
- :mod:`~pathprobe.loadgen.runtime`: the run's state per ``Environment`` (records, flushes,
  monitors, outputs);
- :mod:`~pathprobe.loadgen.listeners`: ``init``, ``test_start`` / ``test_stop``, ``quitting``;
- :mod:`~pathprobe.loadgen.distributed`: what workers and master exchange
  (``report_to_master`` / ``worker_report`` and custom messages);
- :mod:`~pathprobe.loadgen.webview`: the web UI's live view.

The names below stay importable from here.
"""

from __future__ import annotations

from locust import events
from pathprobe.loadgen.config import ENV_API_KEY, ENV_TLS, Config, parse_mix
from pathprobe.loadgen.distributed import MSG_FINAL, MSG_SHARE, MSG_STOP
from pathprobe.loadgen.flags import add_arguments
from pathprobe.loadgen.listeners import attach, on_init, on_quitting, on_test_start, on_test_stop, on_test_stopping
from pathprobe.loadgen.runtime import FLUSH_SLICE, LOCAL_FLUSH_S, Runtime, runtime
from pathprobe.loadgen.tracing import Tracing

__all__ = [
    "ENV_API_KEY",
    "ENV_TLS",
    "FLUSH_SLICE",
    "LOCAL_FLUSH_S",
    "MSG_FINAL",
    "MSG_SHARE",
    "MSG_STOP",
    "Config",
    "Runtime",
    "Tracing",
    "add_arguments",
    "attach",
    "on_init",
    "on_quitting",
    "on_test_start",
    "on_test_stop",
    "on_test_stopping",
    "parse_mix",
    "runtime",
]

events.init_command_line_parser.add_listener(add_arguments)
attach(events)
