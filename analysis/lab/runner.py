"""The names ``pathprobe.analysis.lab.runner`` held before it was split by job; import from the
modules themselves: :mod:`~pathprobe.analysis.lab.procs` (ports, child processes),
:mod:`~pathprobe.analysis.lab.probes` (readiness and handshake probes),
:mod:`~pathprobe.analysis.lab.stack` (the processes of a local compare, each path),
:mod:`~pathprobe.analysis.lab.loadrun` (load runs and what they leave) and
:mod:`~pathprobe.analysis.lab.meta` (versions, timestamps)."""

from __future__ import annotations

from pathprobe.analysis.lab.loadrun import (
    MIXED,
    RunResult,
    cpu_seconds,
    interleavable,
    prepare_prompts,
    read_accounting,
    read_client,
    run_load,
    run_load_mixed,
)
from pathprobe.analysis.lab.meta import now_iso, versions
from pathprobe.analysis.lab.paths import Path_, expected_shift_ms
from pathprobe.analysis.lab.probes import (
    handshake_ms,
    normalize_address,
    parse_startup,
    probe_once,
    served_model,
    url_for,
    wait_ready,
)
from pathprobe.analysis.lab.procs import (
    LOOPBACK,
    Managed,
    Skipped,
    free_port,
    port_in_use,
    reachable,
    split_hostport,
)
from pathprobe.analysis.lab.stack import Stack

__all__ = [
    "LOOPBACK",
    "MIXED",
    "Managed",
    "Path_",
    "RunResult",
    "Skipped",
    "Stack",
    "cpu_seconds",
    "expected_shift_ms",
    "free_port",
    "handshake_ms",
    "interleavable",
    "normalize_address",
    "now_iso",
    "parse_startup",
    "port_in_use",
    "prepare_prompts",
    "probe_once",
    "reachable",
    "read_accounting",
    "read_client",
    "run_load",
    "run_load_mixed",
    "served_model",
    "split_hostport",
    "url_for",
    "versions",
    "wait_ready",
]
