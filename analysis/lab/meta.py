"""Provenance of a compare report: when it ran, where, and with which package versions."""

from __future__ import annotations

import json
import os
import platform
import time
from datetime import UTC, datetime
from importlib import metadata

from pathprobe.analysis.lab.config import CompareConfig
from pathprobe.jsontypes import JsonObject


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("pathprobe", "grpcio", "locust", "aiohttp", "torch", "transformers"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def run_meta(cfg: CompareConfig, started: str, t_start: float) -> JsonObject:
    """The report's ``meta`` block: when (``t_start``: the run's ``time.monotonic()`` at start),
    where, with which versions and which config."""
    return {
        "started": started,
        "finished": now_iso(),
        "wall_s": round(time.monotonic() - t_start, 1),
        "mode": cfg.mode,
        "engine": f"{cfg.server.engine} / {cfg.server.model}" if cfg.mode == "local" else "remote",
        "host": platform.node(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "versions": versions(),
        "config": json.loads(cfg.model_dump_json()),
    }
