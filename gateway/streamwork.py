"""Which part of a gateway's per-chunk work held a stream's end back.

A gateway handles each chunk of a stream (parse it, re-encode it, hand it to the client's
transport) while its upstream produces the next one. Work done before the upstream's last chunk
arrived overlapped the upstream's own time, which ``gw.upstream`` holds; only the work after that
instant held the stream's end back, and only that is taken out of ``gw.upstream`` as the
gateway's (``gw.decode`` / ``gw.encode``) or its client link's (``gw.send``); see
:func:`pathprobe.timing.held_back`, the same rule the server's ``srv.send`` follows.

The instant the last chunk arrived is not seen when the gateway is behind (the chunk waits in the
transport's buffer until the gateway asks for it). It is bounded with the upstream's own emit
offsets (each chunk's ``emit_ms``: a duration since the upstream's request started, so no clock
crosses a process): the last chunk left ``e_last - e_i`` after chunk ``i``, which the gateway saw at
``seen_i``, so it arrived by ``min_i(seen_i + e_last - e_i)``. The chunk with the least delay on
the link bounds it tightest (the minimum-delay filter NTP uses). A gateway that keeps up sees the
last chunk as it arrives (the bound is ``seen_last``: the overlapped work stays in ``gw.upstream``);
one that is behind gets the bound from an earlier chunk (its backlog counts as its own). Chunks
without an emit offset (a third-party upstream) leave only ``seen_last``, which is right while the
gateway keeps up. Where the upstream is a gateway that rebuilt the chunks, their ``fwd_ms`` (its
hand-off offsets) paced them, not the server's emit offsets (:func:`pathprobe.timing.pacing`); a
gateway that rebuilds chunks stamps its own, so its consumer does the same.

Whether a gap in which the gateway's loop slept was a wait for the upstream
(:func:`pathprobe.timing.last_waited`) depends on where its reads land. A socket the loop itself
selects on (aiohttp: ``http-proxy``, ``reencode``) wakes the loop the moment bytes arrive, so a
sleep before a chunk was a wait for it. A grpc.aio call (``transcode``) gets each message from
gRPC's core through a poller thread that hands it to the loop over a socket pair: the loop sleeps
while that thread waits for a core, even for a message that has been in the process for hundreds of
ms (``bench/aio_delivery.py``: 2048 messages read half a second after the last was sent, beside two
busy processes on 2 cores, 44-105 sleeps of 1-9 ms per stream). Such a consumer's sleep
(``reads_on_loop=False``) counts as a wait only where it had also caught up with the upstream's
pacing (the chunk was not due, by the emit-offset bound, before the gap began:
``timing.last_waited``'s ``due``): one behind by tens of ms that slept 1-4 ms was waiting for its
own poller (its backlog); one that kept up and slept was waiting for the chunk (at c=4 on 4-token
streams, with sleeps ignored altogether, 2 % of transcode's records had its upstream side's stack
below zero in the packet witness).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pathprobe import loopwait
from pathprobe.timing import (
    IDLE_MS,
    due_times,
    handoff_split,
    held_back,
    last_arrival,
    last_waited,
    pacing,
    read_backlog,
    tail_after,
)

if TYPE_CHECKING:
    from pathprobe.gateway.aio import Spans

Interval = tuple[float, float]
#: of a gateway's read of its upstream's last chunk after the kernel had it (:mod:`pathprobe.rxstamp`),
#: what stays on the link: the loop's wake-up and the read (0.05-0.5 ms here), as a gap of an idle loop
#: does (``timing.IDLE_MS``). Beyond it the gateway was reading late, busy with its other streams (at
#: c=32 through http-proxy, ~20 ms a stream), which is its own time (``gw.backlog``), not the network's
STAMP_SLACK_MS = IDLE_MS


@dataclass(slots=True)
class StreamWork:
    """One stream's chunks as a gateway saw them, and its per-chunk work, as ``now_ms()`` intervals."""

    #: each chunk: (when the gateway had it, the upstream's emit offset or None)
    seen: list[tuple[float, float | None]] = field(default_factory=list)
    #: each chunk's hand-off offset from a rebuilding gateway upstream (0: none), see ``pacing``
    fwd: list[float] = field(default_factory=list)
    decode: list[Interval] = field(default_factory=list)
    encode: list[Interval] = field(default_factory=list)
    send: list[Interval] = field(default_factory=list)
    #: each chunk: when the bytes that carried it had reached the host, by the kernel's stamp on the
    #: upstream socket (:mod:`pathprobe.rxstamp`; None: not stamped)
    arrived: list[float | None] = field(default_factory=list)
    #: the instant :meth:`held` used as the last chunk's arrival (0: not computed yet)
    last: float = 0.0
    #: whether the chunks reach the gateway through a socket its loop selects on (see the module's
    #: text): then a gap in which that loop slept was a wait for the upstream
    reads_on_loop: bool = True

    def chunk(
        self, seen_ms: float, emit_ms: float | None, fwd_ms: float | None = None, arrived_ms: float | None = None
    ) -> None:
        """A chunk the gateway now has; ``emit_ms`` (the server's) and ``fwd_ms`` (a rebuilding gateway
        upstream's hand-off) <= 0 count as not reported (proto3's default); ``arrived_ms``: when its
        bytes had reached the host (the kernel's stamp of the read that returned them, or a later one)."""
        self.seen.append((seen_ms, emit_ms if emit_ms is not None and emit_ms > 0 else None))
        self.fwd.append(fwd_ms if fwd_ms is not None and fwd_ms > 0 else 0.0)
        self.arrived.append(arrived_ms)

    def _pace(self) -> Sequence[float] | None:
        """The offsets that paced the chunks (:func:`pathprobe.timing.pacing`); None: not reported."""
        return pacing([e or 0.0 for _, e in self.seen], self.fwd, len(self.seen))

    def last_arrival(self, not_before: float = -math.inf) -> float:
        """The latest instant the upstream's last chunk can have arrived, not before ``not_before``
        (the upstream's own time from the call's start: :func:`pathprobe.timing.last_arrival`)."""
        pace = self._pace()
        return last_arrival([(s, pace[i] if pace else None) for i, (s, _) in enumerate(self.seen)], not_before)

    def held(self, not_before: float = -math.inf) -> tuple[float, float, float, float]:
        """(decode, encode, send, backlog): the per-chunk work after the last chunk arrived; of the
        hand-offs to the client's transport after it, the last one's (the link's, ``gw.send``) and what
        the gateway spent behind (``gw.backlog``): the earlier hand-offs after it
        (:func:`pathprobe.timing.handoff_split`) and its reads of chunks that were already waiting
        in its transport's buffer (from the last chunk's arrival until it got to it, less its work
        on the chunks before it)."""
        if not self.seen:
            return 0.0, 0.0, 0.0, 0.0
        seen = [s for s, _ in self.seen]
        work = (*self.decode, *self.encode, *self.send)
        # a gap counts as a wait where the loop slept in it; through grpc.aio only if the gateway had
        # also caught up with the upstream's pacing (see the module's text)
        due = None if self.reads_on_loop else due_times(seen, self._pace())
        waited = last_waited(seen, work, idle=self._idle(), due=due) if self.reads_on_loop or due else -math.inf
        last = self.last = self._stamped(self.last_arrival(max(not_before, waited)), not_before)
        send, backlog = handoff_split(self.send, last)
        tail = (*tail_after(self.decode, last), *tail_after(self.encode, last), *tail_after(self.send, last))
        reads = read_backlog(self.seen[-1][0], last, tail)
        return held_back(self.decode, last), held_back(self.encode, last), send, backlog + reads

    def _stamped(self, bound: float, not_before: float) -> float:
        """``bound`` (the last chunk's arrival by the pacing and the loop's sleeps), no later than
        :data:`STAMP_SLACK_MS` after the kernel's stamp of its bytes, where there is one (and never
        before ``not_before``): a read later than that is the gateway's own lateness."""
        stamp = self.arrived[-1] if self.arrived else None
        if stamp is None:
            return bound
        return min(bound, max(stamp + STAMP_SLACK_MS, not_before))

    @staticmethod
    def _idle() -> Callable[[float, float], bool] | None:
        """The loop's sleeps, which tell a wait for the chunk from being behind (None: not watched)."""
        watch = loopwait.watch_of()
        return watch.idle_between() if watch is not None else None

    def done(self) -> float:
        """When the gateway's work on the chunks it has seen ended (-inf: none yet)."""
        ends = [iv[-1][1] for iv in (self.decode, self.encode, self.send) if iv]
        return max(ends, default=-math.inf)

    def spent(self) -> tuple[float, float, float]:
        """(decode, encode, send): all of the per-chunk work, overlapped or not (the CPU it cost)."""
        return _sum(self.decode), _sum(self.encode), _sum(self.send)


def _sum(intervals: list[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def chunk_spans(spans: Spans, work: StreamWork, held: tuple[float, float, float, float]) -> None:
    """The chunks' work as child spans: what held the stream back (the entries' figures), one
    interval per kind from the last chunk's arrival on, with what overlapped the upstream as an
    attribute (the CPU the chunks cost in all is the sum of the two). Nothing for a stream that
    forwarded no chunk."""
    if not work.decode:
        return
    start = work.last or work.last_arrival()
    spent = work.spent()
    for name, dur, total in zip(("gw.decode", "gw.encode", "gw.send"), held[:3], spent, strict=True):
        if name == "gw.send" and not dur:
            continue
        attrs = {"pathprobe.chunks": len(work.decode), "pathprobe.overlapped_ms": round(max(total - dur, 0.0), 3)}
        spans.child(name, start, dur, attrs)
        start += dur
