"""Provenance of a compare report: when it ran, where, and with which package versions."""

from __future__ import annotations

import platform
from datetime import UTC, datetime
from importlib import metadata


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
