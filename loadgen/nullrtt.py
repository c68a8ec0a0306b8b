"""The network estimate of a silent HTTP server: HTTP null round trips on the requests' connection.

A server that reports nothing about its own time leaves its link unsplit; the part booked as
network is a round trip measured apart (:mod:`pathprobe.rtt`). For HTTP the like-for-like one
is a *null round trip*: a cheap request the server answers without model work (``GET
/v1/models``), sent by the target's own HTTP client on the connection its requests use. It
holds what the network figure of a server that reports its total holds (both HTTP stacks and
the kernel), where a TCP handshake holds only the kernel's part: that stays the floor
(``network_floor_ms``) and the estimate until the first null round trip is timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pathprobe import rtt

if TYPE_CHECKING:
    from pathprobe.loadgen.targets import Outcome

pc = time.perf_counter_ns
#: null round trips timed after the first answer that needs an estimate, then one after every
#: NULL_PROBE_EVERY such answers (every one: on a busy machine a round trip's spread is wide, and the
#: estimate must be a median of as many as the requests' own network figure is); the estimate is
#: the median of the last 64 (:class:`pathprobe.rtt.RoundTrips`)
NULL_PROBES_FIRST = 3
NULL_PROBE_EVERY = 1


def floor(out: Outcome, floor_ms: float | None) -> None:
    """The transport floor (a TCP handshake) as the estimate, until a null round trip replaces it."""
    out.network_estimate_ms = out.network_floor_ms = floor_ms
    out.network_estimate_kind = rtt.TCP_HANDSHAKE if floor_ms is not None else None


class NullRoundTrip:
    """The network estimate of a silent HTTP server: the median of recent HTTP null round trips.

    A null round trip is a cheap request the server answers without model work, sent by the
    target's own HTTP client on the connection its requests use (``send``), so it holds what a
    reporting server's network figure holds: the client's and the server's HTTP stacks and the
    kernel, but no handler work to speak of. Timed only where it is needed (an answer without
    timing entries, or with a report that has no total), after the request: never inside one.
    """

    def __init__(self, send: Callable[[], bool], first: int = NULL_PROBES_FIRST, every: int = NULL_PROBE_EVERY) -> None:
        self.send = send
        self.first, self.every = first, every
        self.samples = rtt.RoundTrips()
        self.silent = 0  # answers seen that needed an estimate

    @staticmethod
    def needed(out: Outcome) -> bool:
        rep = out.server_report
        return out.ok and not out.entries and (rep is None or not rep.has_total)

    def apply(self, out: Outcome) -> None:
        if not self.needed(out):
            return
        n = self.first if self.silent == 0 else 1 if self.silent % self.every == 0 else 0
        self.silent += 1
        for _ in range(n):
            t0 = pc()
            if not self.send():
                break
            self.samples.add((pc() - t0) / 1e6)
        med = self.samples.median()
        if med is not None:
            out.network_estimate_ms, out.network_estimate_kind = med, rtt.HTTP_NULL
