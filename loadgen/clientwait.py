"""Client wait: how long the load generator's own event loop kept a response waiting.

A request's greenlet sends, then sleeps until the hub wakes it with the response. If the
loop is running other greenlets (other users encoding or decoding, Locust's own
bookkeeping, the loop monitor) when the response becomes readable, the response waits
for them, and that wait lands inside the request's e2e. No hop reports it, so the
segment model would book it as network on the client's link.

This module watches the loop thread's greenlet switches (``greenlet.settrace``) and keeps
the current *busy stretch*: consecutive runs of greenlets other than the hub, with the hub
in between for no more than :data:`GAP_NS` (the hub only dispatched ready callbacks; it
did not sit in ``epoll_wait``). When a request's greenlet is resumed right at the end of
such a stretch (within :data:`GAP_NS`), the loop was busy elsewhere up to the moment it
could serve that greenlet: the part of the stretch after the greenlet went to sleep is
booked as that request's wait (per resume; :meth:`WaitTracker.end` returns the wait of
the resume that delivered the end of the response and the total over all resumes).

When the process is preempted for longer than :data:`GAP_NS` right between the other greenlet's end
and the resume, the stretch counts as ended and nothing is booked: the wait stays in network,
the safe side. It is an upper bound per resume: the response became readable at some instant inside
the stretch, not necessarily at its start. The split therefore never books more than the
link's measured network as client wait (see :func:`pathprobe.loadgen.users.build_record`),
and the wire witness (``pathprobe compare --witness pcap``) measures the true arrival.
Cost: one Python call per greenlet switch (~1 us).
"""

from __future__ import annotations

import time
from typing import Any

import greenlet

#: the hub may run this long between two greenlets and still count as "dispatching", not idle
GAP_NS = 100_000

pc = time.perf_counter_ns


class _Waiter:
    __slots__ = ("last_wait_ns", "slept_at", "total_wait_ns")

    def __init__(self) -> None:
        self.slept_at = 0
        self.last_wait_ns = 0
        self.total_wait_ns = 0


class WaitTracker:
    """One per process (the loop thread); install with :meth:`start`, remove with :meth:`stop`."""

    def __init__(self, gap_ns: int = GAP_NS) -> None:
        self.gap_ns = gap_ns
        self.hub: Any = None
        self.run_start = 0  # when the greenlet now running (not the hub) was switched in
        self.stretch_start = 0  # start of the current busy stretch
        self.stretch_end = 0  # end of the last non-hub run
        self.waiters: dict[Any, _Waiter] = {}
        self._prev: Any = None
        self._on = False

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> WaitTracker:
        import gevent

        if self._on:
            return self
        self.hub = gevent.get_hub()
        self._prev = greenlet.settrace(self._trace)
        self._on = True
        return self

    def stop(self) -> None:
        if self._on:
            greenlet.settrace(self._prev)
            self._on = False
        self.waiters.clear()

    # -- per request ----------------------------------------------------------------------
    def begin(self) -> None:
        """The current greenlet starts a request: its waits are counted from now."""
        if self._on:
            self.waiters[greenlet.getcurrent()] = _Waiter()

    def end(self) -> tuple[float, float]:
        """(wait of the last resume, total over every resume) in ms; forgets the request."""
        w = self.waiters.pop(greenlet.getcurrent(), None)
        if w is None:
            return 0.0, 0.0
        return w.last_wait_ns / 1e6, w.total_wait_ns / 1e6

    # -- the switch trace -----------------------------------------------------------------
    def _trace(self, event: str, args: Any) -> None:
        if event == "switch" or event == "throw":
            origin, target = args
            t = pc()
            hub = self.hub
            if origin is not hub:
                w = self.waiters.get(origin)
                if w is not None:
                    w.slept_at = t  # a request greenlet goes to sleep (waits for I/O)
                if self.run_start - self.stretch_end > self.gap_ns or self.stretch_start == 0:
                    self.stretch_start = self.run_start
                self.stretch_end = t
            if target is not hub:
                self.run_start = t
                w = self.waiters.get(target)
                if w is not None and w.slept_at and t - self.stretch_end <= self.gap_ns:
                    wait = self.stretch_end - max(self.stretch_start, w.slept_at)
                    w.last_wait_ns = wait if wait > 0 else 0
                    w.total_wait_ns += w.last_wait_ns
                elif w is not None:
                    w.last_wait_ns = 0
        if self._prev is not None:
            self._prev(event, args)
