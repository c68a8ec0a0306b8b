"""Which part of a gateway's per-chunk work held a stream's end back.

A gateway handles each chunk of a stream (parse it, re-encode it, hand it to the client's
transport) while its upstream produces the next one. Work done before the upstream's last chunk
arrived overlapped the upstream's own time, which ``gw.upstream`` holds; only the work after that
instant held the stream's end back, and only that is taken out of ``gw.upstream`` as the
gateway's (``gw.decode`` / ``gw.encode``) or its client link's (``gw.send``); see
:func:`pathprobe.timing.held_back`, the same rule the server's ``srv.send`` follows.

The instant the last chunk arrived is not seen when the gateway is behind (the chunk waits in the
transport's buffer until the gateway asks for it). Where the kernel stamps the upstream socket's
reads (:mod:`pathprobe.rxstamp`), the stamp of the read that returned the last chunk dates it: our
upstreams write their last chunk and the stream's end at once (:meth:`StreamWork._arrival`).
Without a stamp (TLS), it is bounded with the upstream's own emit
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
(:func:`pathprobe.timing.last_waited`) depends on where its reads land: on a socket the loop itself
selects on (aiohttp: ``http-proxy``, ``reencode``; :mod:`pathprobe.gateway.grpcup`: ``transcode``),
the loop wakes the moment bytes arrive, so a sleep before a chunk was a wait for it. (A grpc.aio
call gets each message from gRPC's core through a poller thread, and its loop sleeps while that
thread waits for a core, even for a message long in the process: ``bench/aio_delivery.py``; that
is why transcode no longer reads through grpc.aio.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pathprobe import loopwait
from pathprobe.timing import (
    IDLE_MS,
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
        last = self.last = self._arrival(not_before)
        send, backlog = handoff_split(self.send, last)
        tail = (*tail_after(self.decode, last), *tail_after(self.encode, last), *tail_after(self.send, last))
        reads = read_backlog(self.seen[-1][0], last, tail)
        return held_back(self.decode, last), held_back(self.encode, last), send, backlog + reads

    def _arrival(self, not_before: float) -> float:
        """The last chunk's arrival, never before ``not_before``. Where the kernel stamped the bytes of
        the read that returned it, that stamp (a read later than :data:`STAMP_SLACK_MS` after it is
        the gateway's own lateness): our HTTP server writes its last event, its timing and the
        ``[DONE]`` at once, so that read's stamp dates the last chunk itself. A gRPC server sends its
        trailers in a batch of their own (grpc.aio's can send them ms after its last message when it
        is busy): a gateway that needs them passes their arrival as ``not_before`` (transcode; the
        work it did before they came overlapped the wait for them). Without a stamp, the bound by the
        pacing and the loop's sleeps.

        The bound assumes the last chunk crossed as quickly as the quickest did, which is early where
        the upstream held its last chunk back (its ``srv.backlog``, its loop busy with others at c=32):
        the gateway's work up to the real arrival, which overlapped the upstream, was then booked as
        held back. Packet witness, 32-token streams: transcode at c=1, its upstream side's stack below
        zero in 42 of 443 records, 0 with the stamp; http-proxy and reencode at c=32, 49 of 2505 and 53
        of 1630, 0 of 2918 and 0 of 1777 (docs/results/2026-12-04-stream-end-write.md). While our
        server wrote the ``[DONE]`` apart, the last event shared its read with it when the gateway was
        behind, and the stamp dated the ``[DONE]``: http-proxy's server link moved by -0.72 ms once in
        five paired 512-token runs when its client link was delayed (bound 0.3). A third-party
        upstream sends no emit offsets, so there is no pacing bound to replace: the stamp caps the
        gateway's own read of the last chunk either way."""
        stamp = self.arrived[-1] if self.arrived else None
        if stamp is not None:
            return max(min(self.seen[-1][0], stamp + STAMP_SLACK_MS), not_before)
        seen = [s for s, _ in self.seen]
        work = (*self.decode, *self.encode, *self.send)
        waited = last_waited(seen, work, idle=self._idle())  # a gap counts as a wait where the loop slept
        return self.last_arrival(max(not_before, waited))

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
