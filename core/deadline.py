"""Deadlines and retry hints carried across every hop.

- A deadline travels as gRPC's own ``grpc-timeout`` (``<digits><unit>``, units H M S m u n)
  on gRPC hops and as the same header on HTTP hops (grpc-gateway reads it the same way), so
  a gateway can pass the caller's remaining time on whatever protocol it speaks upstream.
  Inside a process it is an absolute :func:`pathprobe.timing.now_ms` instant.
- An overloaded hop answers at once with a retry hint: HTTP ``Retry-After`` (seconds) and
  gRPC ``grpc-retry-pushback-ms`` trailing metadata (the gRFC A6 retry pushback key).
"""

from __future__ import annotations

import math

from pathprobe.errors import InvalidArgument
from pathprobe.timing import now_ms

TIMEOUT_HEADER = "grpc-timeout"
RETRY_AFTER = "Retry-After"
PUSHBACK_KEY = "grpc-retry-pushback-ms"

_UNITS_S = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def parse_timeout(value: str | None) -> float | None:
    """``"250m"`` -> 0.25 (seconds); None/empty -> None; anything else is InvalidArgument."""
    if not value:
        return None
    v = value.strip()
    if len(v) < 2 or v[-1] not in _UNITS_S or not v[:-1].isdigit() or len(v) > 9:
        raise InvalidArgument(TIMEOUT_HEADER, f"expected 1-8 digits and a unit (H M S m u n), got {value!r}")
    return int(v[:-1]) * _UNITS_S[v[-1]]


def format_timeout(seconds: float) -> str:
    """Seconds as a ``grpc-timeout`` value (milliseconds, rounded up; at least 1m)."""
    ms = max(1, math.ceil(seconds * 1000))
    if ms < 100_000_000:
        return f"{ms}m"
    return f"{min(99_999_999, math.ceil(seconds))}S"


def deadline_in(seconds: float | None) -> float:
    """An absolute now_ms() instant ``seconds`` from now; 0.0 = no deadline."""
    return 0.0 if seconds is None else now_ms() + seconds * 1000.0


def retry_after_header(ms: float) -> str:
    """``Retry-After`` is whole seconds: rounded up, at least 1."""
    return str(max(1, math.ceil(ms / 1000.0)))
