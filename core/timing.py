"""In-band timing: durations in W3C ``Server-Timing`` syntax.

Every hop measures durations only, with a monotonic clock, and reports them as
``name;dur=1.234, other;dur=0.050`` (milliseconds). No absolute timestamp ever
crosses a process, so clock skew cannot corrupt a split.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

#: gRPC trailing-metadata key and HTTP header that carry the entries.
METADATA_KEY = "server-timing"
HTTP_HEADER = "Server-Timing"

SERVER_ENTRIES = (
    "srv.decode",
    "srv.queue",
    "srv.tokenize",
    "srv.prefill",
    "srv.decode_steps",
    "srv.detokenize",
    "srv.encode",
    "srv.total",
)
GATEWAY_ENTRIES = ("gw.decode", "gw.upstream", "gw.encode", "gw.total")


def now_ms() -> float:
    """Monotonic time in milliseconds (only differences are meaningful)."""
    return time.perf_counter_ns() / 1e6


def format_entries(entries: Mapping[str, float]) -> str:
    """``{"srv.total": 1.5}`` -> ``"srv.total;dur=1.500"`` (microsecond resolution)."""
    return ", ".join(f"{name};dur={dur:.3f}" for name, dur in entries.items())


def parse(value: str | None) -> dict[str, float]:
    """Parse a ``Server-Timing`` string; unknown parameters are ignored.

    Entries without ``dur`` are kept with duration 0. A repeated name keeps the
    last value (a hop never repeats its own names; forwarding only appends).
    """
    out: dict[str, float] = {}
    if not value:
        return out
    for item in value.split(","):
        parts = [p.strip() for p in item.split(";")]
        name = parts[0]
        if not name:
            continue
        dur = 0.0
        for param in parts[1:]:
            key, _, raw = param.partition("=")
            if key.strip().lower() == "dur":
                try:
                    dur = float(raw.strip().strip('"'))
                except ValueError:
                    dur = 0.0
        out[name] = dur
    return out


def parse_all(values: Iterable[str]) -> dict[str, float]:
    """Merge several header/metadata values (HTTP allows repeating the header)."""
    out: dict[str, float] = {}
    for v in values:
        out.update(parse(v))
    return out


def append(upstream: str | None, own: Mapping[str, float]) -> str:
    """What a gateway sends on: the upstream's entries untouched, then its own."""
    mine = format_entries(own)
    if not upstream:
        return mine
    return f"{upstream}, {mine}" if mine else upstream


def from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, float]:
    """Entries from gRPC (trailing) metadata."""
    values: list[str] = []
    for key, value in metadata or ():
        if key == METADATA_KEY:
            values.append(value.decode() if isinstance(value, bytes) else value)
    return parse_all(values)


class Stopwatch:
    """Accumulates named durations measured with the monotonic clock."""

    __slots__ = ("entries", "_t0")

    def __init__(self) -> None:
        self.entries: dict[str, float] = {}
        self._t0 = now_ms()

    def add(self, name: str, ms: float) -> None:
        self.entries[name] = self.entries.get(name, 0.0) + ms

    def since_start(self) -> float:
        return now_ms() - self._t0

    def total(self, name: str) -> float:
        """Record ``name`` as the time since this stopwatch started."""
        ms = self.since_start()
        self.entries[name] = ms
        return ms
