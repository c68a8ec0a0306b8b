"""A hop's wait for its own event loop: how long a request's bytes sat readable while the loop was busy.

A hop that serves many requests on one asyncio loop (the server's HTTP front end, a gateway) picks a
request up only when its loop gets to the connection's read callback. When the loop is running
other requests' work, the request waits, before the hop's first timestamp (``t0``): no entry of the
hop covers it, so the split would book it as network on the link to the hop. This module measures
it, as :mod:`pathprobe.loadgen.clientwait` measures the client's own wait.

:class:`LoopWatch` wraps the loop's selector. Each ``select`` that returns a readable socket also
bounds when its bytes became readable: after the previous ``select`` returned, when this one found
them at once (the loop was busy running callbacks in between: the bytes waited for it), or when
this one returned, when it slept first (the loop was idle and woke for them). That instant, the
socket's *floor*, is kept per socket (the latest readiness wins) until the hop takes it at the
request's first timestamp: ``t0 - floor`` is the request's wait (:func:`wait_ms`; ``srv.wait``,
``gw.wait``), the hop's queueing. It is an upper bound: the bytes arrived at some instant between
the two ``select`` returns, not necessarily at the first one; so the split never books more than
the link's measured network as the hop's wait (:func:`pathprobe.segments.split`), and the wire
witness (``pathprobe compare --witness pcap``) sees the real arrival.

The same floor times a forwarding hop's wait for its loop *after* its upstream answered
(``gw.upwait``, inside ``gw.upstream``: :func:`read_wait_ms` on the upstream connection's socket;
transcode's own gRPC client dates its answers itself, :mod:`pathprobe.gateway.grpcup`):
a gateway whose loop is busy with 32 other requests reads its upstream's answer late, and that is its
queueing, not the upstream link's network.

Not measured (left in network, the safe side): the kernel's accept queue and a socket's receive
buffer before it became readable to this loop's ``select``; a loop without a Python selector
(uvloop); gRPC front ends served by grpc.aio, whose sockets and pending calls live in gRPC's core
(the loop sees a call only when it asks for the next one; :mod:`pathprobe.grpcwait` measures those
from the caller's deadline). A floor older than :data:`MAX_AGE` loop
iterations is not used (the handler of a request runs within a couple of iterations of its read;
an older floor belongs to an earlier request on the same socket number).
Cost: one Python call per loop iteration (~1-2 us) and one dict store per readable socket.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import selectors
import weakref
from collections.abc import Callable

from pathprobe import rxstamp
from pathprobe.timing import now_ms

#: a ``select`` that returned within this (ms) did not sleep: the loop was busy up to it
GAP_MS = 0.1
#: a floor taken more than this many loop iterations after its readiness is not used
MAX_AGE = 8
#: sleeps kept (a stream's gaps are asked about at its end: 4096 covers a 2048-token stream's)
SLEEPS = 4096

_WATCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWatch] = weakref.WeakKeyDictionary()


class LoopWatch:
    """One per event loop: :func:`install` it, then :meth:`take` a socket's floor at a request's start."""

    __slots__ = ("_floors", "_last_return", "gap_ms", "iteration", "max_age", "sleeps")

    def __init__(self, gap_ms: float = GAP_MS, max_age: int = MAX_AGE) -> None:
        self.gap_ms = gap_ms
        self.max_age = max_age
        self.iteration = 0
        self._last_return = 0.0
        self._floors: dict[int, tuple[float, int]] = {}
        #: the latest ``select`` calls that slept (start, end): the loop had nothing to run then
        self.sleeps: collections.deque[tuple[float, float]] = collections.deque(maxlen=SLEEPS)

    def wrap(self, selector: selectors.BaseSelector) -> None:
        """Measure every ``select`` of ``selector`` (the loop's)."""
        inner = selector.select
        floors = self._floors
        read = selectors.EVENT_READ

        def select(timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            start = now_ms()
            events = inner(timeout)
            end = now_ms()
            self.iteration += 1
            slept = end - start > self.gap_ms
            if slept:
                self.sleeps.append((start, end))
            floor = self._last_return if not slept and self._last_return else end
            self._last_return = end
            it = self.iteration
            for key, mask in events:
                if mask & read:
                    floors[key.fd] = (floor, it)
            return events

        selector.select = select  # type: ignore[method-assign]

    def idle_between(self) -> Callable[[float, float], bool]:
        """A test of whether this loop slept in ``select`` (had nothing to run) at some instant inside
        ``(a, b)``, over the sleeps recorded so far. A consumer that was *waiting* for its next chunk
        lets its loop sleep; one that was behind (preempted, or running other requests' work) did
        not, however long its gap (:func:`pathprobe.timing.last_waited`)."""
        sleeps = list(self.sleeps)
        ends = [e for _, e in sleeps]

        def idle(a: float, b: float) -> bool:
            i = bisect.bisect_right(ends, a)  # the first sleep that ended after a
            return i < len(sleeps) and sleeps[i][0] < b

        return idle

    def slept_since(self, t: float) -> bool:
        """Whether this loop slept in ``select`` (had nothing to run) at some instant after ``t``: the
        latest sleep recorded ended after it. O(1), for a request's hot path."""
        return bool(self.sleeps) and self.sleeps[-1][1] > t

    def peek(self, fd: int) -> float | None:
        """The floor of ``fd``'s latest readiness, kept (a connection that reads on asks again)."""
        got = self._floors.get(fd)
        if got is None or self.iteration - got[1] > self.max_age:
            return None
        return got[0]

    def take(self, fd: int) -> float | None:
        """The floor of ``fd``'s latest readiness (ms, :func:`pathprobe.timing.now_ms`), forgotten once
        taken; None when there is none recent enough."""
        floor = self.peek(fd)
        self._floors.pop(fd, None)
        return floor


def install(loop: asyncio.AbstractEventLoop | None = None) -> LoopWatch | None:
    """Watch ``loop`` (the running one by default); None when it has no Python selector (uvloop)."""
    loop = loop or asyncio.get_running_loop()
    have = _WATCHES.get(loop)
    if have is not None:
        return have
    selector = getattr(loop, "_selector", None)
    if not isinstance(selector, selectors.BaseSelector):
        return None
    watch = LoopWatch()
    watch.wrap(selector)
    _WATCHES[loop] = watch
    return watch


def watch_of(loop: asyncio.AbstractEventLoop | None = None) -> LoopWatch | None:
    """The watch installed on ``loop`` (the running one by default), or None."""
    try:
        loop = loop or asyncio.get_running_loop()
    except RuntimeError:
        return None
    return _WATCHES.get(loop)


def fd_of(transport: object) -> int | None:
    """The socket number of an asyncio transport (None: none, or closed)."""
    get = getattr(transport, "get_extra_info", None)
    if get is None:
        return None
    sock = get("socket")
    try:
        fd = sock.fileno() if sock is not None else -1
    except (OSError, ValueError):
        return None
    return fd if fd >= 0 else None


def floor_of(transport: object) -> float | None:
    """The floor of a connection's latest readiness on the running loop (:meth:`LoopWatch.take`), taken
    at a request's start; None when not measured.

    On a loop that runs long iterations (a saturated server) the floor can be an iteration early: the
    bytes came somewhere between it and the select that saw them. Where the kernel stamps what the
    connection reads (:func:`pathprobe.rxstamp.stamp_transport`, from the connection's second request
    on), the last read's stamp, when later, is the floor: the request's bytes were not there before it."""
    watch = watch_of()
    fd = fd_of(transport) if watch is not None else None
    if watch is None or fd is None:
        return None
    floor = watch.take(fd)
    arrived = rxstamp.arrived_ms(rxstamp.stamp_transport(transport))
    return floor if floor is None or arrived is None else max(floor, arrived)


def body_wait_ms(t_start: float, t_end: float) -> float | None:
    """A handler's read of its request body from ``t_start`` (the headers in) to ``t_end`` (the body
    in) on the running loop: the read itself where the loop slept meanwhile (the handler waited for
    the body's bytes: the links' time, ``srv.body``), 0.0 where it never slept (the bytes were in; the
    read was the loop's turns, the hop's own), None when the loop is not watched."""
    watch = watch_of()
    if watch is None:
        return None
    return t_end - t_start if watch.slept_since(t_start) else 0.0


def wait_ms(floor: float | None, t0: float) -> float | None:
    """A request's wait for the loop before its hop's first timestamp ``t0`` (``<kind>.wait``): ``t0``
    less its connection's floor (:func:`floor_of`); None when not measured."""
    return None if floor is None else max(0.0, t0 - floor)


def read_wait_ms(fd: int | None, since: float, t: float) -> float | None:
    """How long an upstream's answer sat readable on socket ``fd`` while the loop was busy, before the
    coroutine reading it resumed at ``t`` (``<kind>.upwait``): ``t`` less the floor of the socket's
    latest readiness, when that came after ``since`` (the call's start); None when not measured."""
    watch = watch_of()
    floor = watch.take(fd) if watch is not None and fd is not None else None
    return _after(floor, since, t)


def _after(floor: float | None, since: float, t: float) -> float | None:
    """:func:`wait_ms` of a floor that counts only if it came after ``since`` (the call's start)."""
    return wait_ms(floor if floor is not None and floor >= since else None, t)
