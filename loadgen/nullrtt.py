"""The network estimate of a silent HTTP server: HTTP null round trips on the requests' connection.

A server that reports nothing about its own time leaves its link unsplit; the part booked as
network is a round trip measured apart (:mod:`pathprobe.rtt`). For HTTP the like-for-like one
is a *null round trip*: a cheap request the server answers without model work (``GET
/v1/models``), sent by the target's own HTTP client on the connection its requests use. It
holds what the network figure of a server that reports its total holds (both HTTP stacks and
the kernel), where a TCP handshake holds only the kernel's part: that stays the floor
(``network_floor_ms``, at most the shortest null round trip) and the estimate until the first null
round trip is timed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pathprobe import rtt

if TYPE_CHECKING:
    from pathprobe.loadgen.call import Outcome

pc = time.perf_counter_ns
#: null round trips timed after the first answer that needs an estimate, then one after each such
#: answer until NULL_WARM are held (on a busy machine one round trip's spread is wider than the
#: figure: the median needs many), then one after every NULL_PROBE_EVERY answers, so a long run
#: adds a cheap request to every fourth, not to every one; the estimate is the median of the last
#: NULL_KEEP (:class:`pathprobe.rtt.RoundTrips`)
NULL_PROBES_FIRST = 3
NULL_WARM = 16
NULL_PROBE_EVERY = 4
NULL_KEEP = 64
#: the connection and both ends sit idle this long before each null round trip, as they do while a
#: request waits for the model: a round trip from idle pays the scheduler's wake-ups that a
#: back-to-back one does not (on our own server, where network is measured exactly, the median
#: estimate was 0.1-0.23 ms below the measured network without the pause, within 0.08 ms with it)
NULL_IDLE_S = 0.005


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
    Its cost to the load: a closed-loop user sends its next request up to NULL_IDLE_S later after
    a probed answer (every one of the first NULL_WARM, then every NULL_PROBE_EVERY-th).
    """

    def __init__(
        self,
        send: Callable[[], bool],
        first: int = NULL_PROBES_FIRST,
        every: int = NULL_PROBE_EVERY,
        idle_s: float = NULL_IDLE_S,
    ) -> None:
        self.send = send
        self.first, self.every, self.idle_s = first, every, idle_s
        self.samples = rtt.RoundTrips(NULL_KEEP)
        self.shortest: float | None = None  # the shortest null round trip of the run
        self.silent = 0  # answers seen that needed an estimate

    @staticmethod
    def needed(out: Outcome) -> bool:
        rep = out.server_report
        return out.ok and not out.entries and (rep is None or not rep.has_total)

    def apply(self, out: Outcome) -> None:
        if not self.needed(out):
            return
        if self.silent == 0:
            n = self.first
        else:
            n = 1 if len(self.samples) < NULL_WARM or self.silent % self.every == 0 else 0
        self.silent += 1
        for _ in range(n):
            time.sleep(self.idle_s)  # cooperative under gevent: other users run meanwhile
            t0 = pc()
            if not self.send():
                break
            ms = (pc() - t0) / 1e6
            self.samples.add(ms)
            self.shortest = ms if self.shortest is None else min(self.shortest, ms)
        med = self.samples.median()
        if med is not None:
            out.network_estimate_ms, out.network_estimate_kind = med, rtt.HTTP_NULL
        self._bound_floor(out)

    def _bound_floor(self, out: Outcome) -> None:
        """The transport floor is at most the shortest null round trip: one holds a transport round
        trip. The handshakes it starts from are few, timed as the load process starts; on the busy
        2-core CI machine their shortest came out 0.199 ms against a 0.141 ms null-round-trip median."""
        if self.shortest is not None and (out.network_floor_ms is None or self.shortest < out.network_floor_ms):
            out.network_floor_ms = self.shortest
