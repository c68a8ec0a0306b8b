"""In-band timing: durations in W3C ``Server-Timing`` syntax.

Every hop measures durations only, with a monotonic clock, and reports them as
``name;dur=1.234, other;dur=0.050`` (milliseconds). No absolute timestamp ever
crosses a process, so clock skew cannot corrupt a split.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: gRPC trailing-metadata key and HTTP header that carry the entries.
METADATA_KEY = "server-timing"
HTTP_HEADER = "Server-Timing"
#: gRPC trailing-metadata key and HTTP header (same name, any case) that carry a model server's
#: prompt tokens served from its prefix cache: a count, not a duration, so not a Server-Timing entry
CACHED_TOKENS_KEY = "pathprobe-cached-tokens"

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
#: the part (``<kind>.send``) a hop that streams reports: of its total, the time its handler waited
#: on its own transport to take the chunks it sent towards the client (``srv.send``, ``gw.send``),
#: the last hand-off's part that held the stream's end back (:func:`handoff_split`). It is the link's stack time, like
#: a unary answer's hand-off after ``<kind>.total``: the split books it as network of the link
#: between the hop and its client, not as the hop's own time
SEND_PART = "send"
#: of a hop that streams, its hand-offs to its transport after its producer was done, before the last
#: one (:func:`handoff_split`): it was behind, and that time is its own (booked in its "other")
BACKLOG_PART = "backlog"
#: the part (``<kind>.wait``) a hop on an event loop reports: how long the request's bytes sat readable
#: while its loop was busy with other work, before its first timestamp (:mod:`pathprobe.loopwait`; an
#: upper bound). Outside its total: the split takes it from the link to the hop and books it as the
#: hop's queueing, capped at that link's time
WAIT_PART = "wait"
#: the part (``<kind>.upwait``) a forwarding hop on an event loop reports: inside its ``upstream``, how
#: long its upstream's answer sat in the hop (readable on its socket, or handed over by gRPC's poller)
#: while its loop was busy with other work, before the hop read it (:mod:`pathprobe.loopwait`; an upper
#: bound); on http-proxy's streams, how long its loop ran other work before its request left
#: (:mod:`pathprobe.rxstamp`'s timed sends). The split takes it from the link to the upstream and books
#: it as the hop's queueing, capped at that link's time
UPWAIT_PART = "upwait"
#: the part (``<kind>.body``) a server reports: of its total, at its start, how long its handler waited
#: for the request body's bytes after the headers (a prompt of 100 KB or more crossing a slow link in
#: several round trips, or forwarded as it came by a hop that streams request bodies). It is the
#: links' time: the split books it as network, on the link to the server, or behind hops that stream
#: request bodies (:data:`pathprobe.segments.STREAMS_REQUEST_BODY`), on a link in front of them
BODY_PART = "body"
#: the entry prefix of a model server's hop
SERVER_KIND = "srv"
#: the entry prefix of a pathprobe gateway's hop
GATEWAY_KIND = "gw"


def now_ms() -> float:
    """Monotonic time in milliseconds (only differences are meaningful)."""
    return time.perf_counter_ns() / 1e6


#: an interval on one process's monotonic clock: (start, end), ms
Interval = tuple[float, float]


def held_back(handoffs: Iterable[Interval], last_ms: float) -> float:
    """The part of a stream's per-chunk intervals (a hop's hand-offs to its own transport, its
    encodes, its decodes) that held the stream's end back: what lies after ``last_ms``, the moment
    the hop had the last of what it forwards (a server: its engine's last token ready; a gateway or
    the client: its upstream's last chunk arrived, :func:`last_arrival`). Before that, every such
    interval overlapped the work upstream of it (the producer making the next chunk), which the
    upstream's time (or the engine's) already counts; counting it again would double it.

    This is the one rule for every per-chunk cost on every side: what held the stream's end back
    counts once, what overlapped the producer's next chunk does not count again.

    ``handoffs`` in the order they happened (each kind's intervals come one after another), so only
    the tail after ``last_ms`` is walked: a 2048-chunk stream's end is not held up by its bookkeeping."""
    return sum(max(0.0, end - max(start, last_ms)) for start, end in tail_after(handoffs, last_ms))


def tail_after(intervals: Iterable[Interval], t: float) -> Iterable[Interval]:
    """The intervals (in the order they happened) that end after ``t``, walked from the end."""
    if not isinstance(intervals, Sequence):
        return intervals
    i = len(intervals)
    while i and intervals[i - 1][1] > t:
        i -= 1
    return intervals[i:]


def handoff_split(handoffs: Sequence[Interval], last_ms: float) -> tuple[float, float]:
    """(send, backlog): a stream's hand-offs to the hop's transport that held its end back
    (:func:`held_back`), split in two. ``send``: the last hand-off's, the link's stack time as a
    unary answer's hand-off after ``<kind>.total`` is (``<kind>.send``). ``backlog``: the earlier
    ones after ``last_ms``: chunks the hop still had to hand over when its producer was done, i.e.
    the hop was behind; that time is the hop's own (``<kind>.backlog``, in its "other"), not the
    link's."""
    if not handoffs:
        return 0.0, 0.0
    send = held_back(handoffs[-1:], last_ms)
    return send, held_back(handoffs[:-1], last_ms)


def last_arrival(seen: Sequence[tuple[float, float | None]], not_before: float = -math.inf) -> float:
    """The latest instant a stream's last chunk can have arrived at a consumer (a gateway, the
    client), from each chunk's ``(seen, emit)``: when the consumer had it (its clock) and the
    server's emit offset (ms since the server's request start; None: not reported).

    A consumer that is behind sees the last chunk late (it waits in the transport's buffer until the
    consumer asks for it). The last chunk left ``e_last - e_i`` after chunk ``i``, which the consumer
    saw at ``seen_i``, so it arrived by ``min_i(seen_i + e_last - e_i)``: the chunk with the least
    delay bounds it tightest (the minimum-delay filter NTP uses). No clock crosses a process. A
    consumer that keeps up gets ``seen_last``; one that is behind an earlier instant (its backlog is
    its own). Without emit offsets it is ``seen_last``, right while the consumer keeps up.

    ``not_before``: when the producer had, at the earliest, handed the last chunk over: the consumer's
    request start plus the producer's own reported time (:func:`own_ms`). The bound above assumes the
    last chunk took no longer from its emit to the consumer than the quickest chunk did; when the
    producer's own hand-off of it was late (its loop busy), that would book the producer's lateness as
    the consumer's backlog, so the instant is never put before the producer was done. Together the
    two keep every link non-negative: what the consumer books after this instant lies outside the
    producer's own time."""
    if not seen:
        return 0.0
    seen_last, e_last = seen[-1]
    if e_last is None:
        return seen_last
    bound = min(s + e_last - e for s, e in seen if e is not None and e <= e_last)
    return min(max(bound, not_before), seen_last)


def pacing(emit_ms: Sequence[float], fwd_ms: Sequence[float], n: int) -> Sequence[float] | None:
    """The offsets that paced a stream's chunks to their next consumer, for :func:`last_arrival`: the
    outermost rebuilding gateway's hand-off offsets (``fwd_ms``) when every chunk has one, else the
    server's emit offsets. A gateway that falls behind its upstream hands chunks on at its own pace;
    against the server's offsets the chunks then look late by its growing backlog, and the bound
    puts the last chunk's arrival so early that the next consumer's wait for it reads as its own.
    ``n``: the stream's chunks; None when neither has an offset (> 0) for each of them."""
    for offsets in (fwd_ms, emit_ms):
        if n and len(offsets) == n and all(f > 0 for f in offsets):
            return offsets
    return None


#: a consumer idle this long right before it had a chunk was waiting for it (the chunk arrived then).
#: A stalled link withholds chunks for milliseconds (a delaying relay's burst: 2.5-4 ms); a consumer
#: reading chunks already waiting gets to the next within tens of microseconds when it has the CPU.
#: On a busy 2-core machine a preempted consumer also sits "idle" for a time slice: 0.1 ms took
#: those for waiting and left transcode's and http-proxy's backlog reads in the server link's
#: network (7-16 ms at load average 9); 1 ms keeps most of them the consumer's
IDLE_MS = 1.0


def last_waited(
    seen: Sequence[float],
    work: Iterable[Interval],
    idle_ms: float = IDLE_MS,
    idle: Callable[[float, float], bool] | None = None,
) -> float:
    """The last instant a consumer had a chunk it had been *waiting* for: the latest ``seen_i`` with
    the consumer idle for more than ``idle_ms`` right before it (no per-chunk ``work`` of its own
    ending within that stretch; -inf: none). That chunk arrived then, and every later one after it,
    so the last chunk's arrival is not earlier (:func:`last_arrival`'s ``not_before``): the emit-offset
    bound assumes every chunk crossed the path in the least time any did, which a link's jitter (a
    burst after a stall) breaks; the consumer's own idleness is measured, not assumed.

    ``idle(a, b)``: where the consumer's event loop is watched (:meth:`pathprobe.loopwait.LoopWatch.idle_between`),
    whether it slept at some instant in ``(a, b)``. A stretch without work in which the loop never
    slept was not a wait for the chunk: the consumer was preempted or running other requests' work
    while the chunk waited in its buffer (a 2048-token stream through a gateway that fell behind on
    a busy 2-core machine: time slices of several ms), which is its backlog, not the link's."""
    ends = sorted(end for _, end in work)
    out = -math.inf
    for s in seen:
        i = bisect.bisect_right(ends, s)
        prev = ends[i - 1] if i else -math.inf
        if s - prev > idle_ms and (idle is None or idle(prev, s)):
            out = s
    return out


def own_ms(value: str | None) -> float:
    """When a producer had, at the earliest, handed over a stream's last chunk, from the consumer's call
    start, from the entries it sent (its hop is the last one in ``value``): :func:`handed_over_ms`; 0
    when it reports none."""
    hops = parse_chain(value).hops
    return handed_over_ms(hops[-1]) if hops else 0.0


def handed_over_ms(hop: Hop) -> float:
    """A hop's earliest hand-off of a stream's last chunk, from its caller's call start: its wait
    before its first timestamp (``<kind>.wait``: the request was there, its loop busy), its
    ``<kind>.total`` less its ``<kind>.send`` (the last hand-off, the link's). Every part lies after
    the request reached the hop, so the link's time only adds to it: a floor, never late. Without the
    wait it is early by the hop's front-end queueing (5-12 ms a request at c=32 on loopback), and a
    consumer could count its work in that stretch as held back, though it overlapped the producer."""
    return max(0.0, hop.get(WAIT_PART) + hop.get("total") - hop.get(SEND_PART))


def finished_ms(value: str | None) -> float:
    """When a producer was done, from the consumer's call start, from the entries it sent (its hop is
    the last one in ``value``): its wait before its first timestamp (``<kind>.wait``: a gRPC server's
    is measured from the deadline the caller's call stamped, :mod:`pathprobe.grpcwait`) plus its whole
    ``<kind>.total``, last hand-off included; 0 when it reports none. A gRPC producer sends its status
    (and these entries) in the trailers only after that, so a consumer that needs the trailers to finish
    the stream had nothing to finish before (:func:`own_ms`: the last chunk's earliest hand-off)."""
    hops = parse_chain(value).hops
    return hops[-1].get(WAIT_PART) + hops[-1].get("total") if hops else 0.0


def read_backlog(seen_last: float, last_ms: float, work: Iterable[Interval]) -> float:
    """What a consumer that was behind spent getting to chunks already waiting in its transport's
    buffer: from ``last_ms`` (the last chunk's arrival, :func:`last_arrival`) to ``seen_last`` (when
    it had that chunk), less its own per-chunk ``work`` inside that stretch (booked apart). 0 for a
    consumer that keeps up (``last_ms == seen_last``). That time is the consumer's own, not the
    link's: it reads its backlog."""
    worked = sum(max(0.0, min(end, seen_last) - max(start, last_ms)) for start, end in work)
    return max(0.0, seen_last - last_ms - worked)


class Entries(dict[str, float]):
    """A hop's entries (name -> ms) with the counts that travel beside them (``cached_tokens``:
    :data:`CACHED_TOKENS_KEY`), so a front end that formats the entries also finds the counts."""

    __slots__ = ("cached_tokens",)

    def __init__(self, *args: Any, cached_tokens: int = 0, **kw: float) -> None:
        super().__init__(*args, **kw)
        self.cached_tokens = cached_tokens


def count_items(entries: Mapping[str, float] | None) -> tuple[tuple[str, str], ...]:
    """The counts beside ``entries`` as (lower-case key, value) pairs; none when there are none."""
    n = getattr(entries, "cached_tokens", 0)
    return ((CACHED_TOKENS_KEY, str(n)),) if n else ()


def metadata(entries: Mapping[str, float]) -> tuple[tuple[str, str], ...]:
    """gRPC trailing metadata for a hop's ``entries``: ``server-timing`` and the counts beside it."""
    return ((METADATA_KEY, format_entries(entries)), *count_items(entries))


def format_entries(entries: Mapping[str, float]) -> str:
    """``{"srv.total": 1.5}`` -> ``"srv.total;dur=1.500"`` (microsecond resolution)."""
    return ", ".join(f"{name};dur={dur:.3f}" for name, dur in entries.items())


def _items(value: str | None) -> Iterable[tuple[str, float, str | None]]:
    """``(name, dur, desc)`` for each entry of a ``Server-Timing`` string, in order.

    Entries without ``dur`` (or with an unreadable or non-finite one) have duration 0; other
    parameters are ignored. Plain ``name;dur=x`` items take a fast path (2-3x cheaper).
    """
    if not value:
        return
    for item in value.split(","):
        name, sep, raw = item.partition(";dur=")
        if sep and ";" not in raw and ";" not in name:
            try:
                dur = float(raw)
            except ValueError:
                pass
            else:
                if math.isfinite(dur):
                    yield name.strip(), dur, None
                    continue
        parts = [p.strip() for p in item.split(";")]
        name = parts[0]
        if not name:
            continue
        dur = 0.0
        desc: str | None = None
        for param in parts[1:]:
            key, _, val = param.partition("=")
            key = key.strip().lower()
            if key == "dur":
                try:
                    dur = float(val.strip().strip('"'))
                except ValueError:
                    dur = 0.0
                if not math.isfinite(dur):  # nan / inf would poison every statistic downstream
                    dur = 0.0
            elif key == "desc":
                desc = val.strip().strip('"')
        yield name, dur, desc


def parse(value: str | None) -> dict[str, float]:
    """Parse a ``Server-Timing`` string into ``{name: dur}``.

    A repeated name keeps the last value: for a chain of hops use :func:`parse_chain`,
    which keeps every hop apart.
    """
    return {name: dur for name, dur, _ in _items(value)}


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


def from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Chain:
    """Entries from gRPC (trailing) metadata, hop by hop."""
    values: list[str] = []
    for key, value in metadata or ():
        if key == METADATA_KEY:
            values.append(value.decode() if isinstance(value, bytes) else value)
    return parse_chain(values)


def kind_of(name: str) -> str:
    """``"gw.total"`` -> ``"gw"``: the prefix that names the hop an entry belongs to."""
    return name.partition(".")[0]


@dataclass(frozen=True, slots=True)
class Hop:
    """One reporting hop's entries (full names, e.g. ``gw.upstream``).

    Contract of a reporting hop: ``<kind>.total`` is the time from receiving the request
    to sending the end of the response; a hop that forwards also reports
    ``<kind>.upstream`` (the time its upstream took, seen from it); ``<kind>.decode`` and
    ``<kind>.encode`` are its serialization; a hop that streams reports ``<kind>.send``, the
    time its handler waited on its transport to take the chunks it sent downstream (inside its
    total, outside its upstream: the downstream link's stack time, see :data:`SEND_PART`); the
    rest of its total is its own overhead.
    """

    kind: str
    entries: dict[str, float] = field(default_factory=dict)
    desc: str | None = None

    def get(self, part: str, default: float = 0.0) -> float:
        return self.entries.get(f"{self.kind}.{part}", default)

    def has(self, part: str) -> bool:
        return f"{self.kind}.{part}" in self.entries

    @property
    def label(self) -> str:
        return f"{self.kind} ({self.desc})" if self.desc else self.kind

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "desc": self.desc, "entries": dict(self.entries)}


class Chain(dict[str, float]):
    """Every hop's entries merged by name (a repeated name keeps the last hop's value, as
    :func:`parse` does), plus :attr:`hops`: each hop apart, innermost (the server) first,
    in the order the hops appended them."""

    __slots__ = ("hops",)

    def __init__(self, hops: Iterable[Hop] = ()) -> None:
        self.hops: tuple[Hop, ...] = tuple(hops)
        super().__init__()
        for hop in self.hops:
            self.update(hop.entries)


def parse_chain(values: str | Iterable[str] | None) -> Chain:
    """Parse ``Server-Timing`` value(s) that hops appended one after another.

    Consecutive entries with the same prefix form one hop, and ``<prefix>.total`` closes
    its hop, so two gateways of the same kind (both ``gw.*``) stay apart. A ``desc`` on
    any of a hop's entries becomes the hop's label.
    """
    if values is None:
        return Chain()
    if isinstance(values, str):
        values = (values,)
    hops: list[Hop] = []
    cur: dict[str, float] = {}
    kind = ""
    desc: str | None = None
    for value in values:
        for name, dur, d in _items(value):
            k = kind_of(name)
            if cur and k != kind:
                hops.append(Hop(kind, cur, desc))
                cur, desc = {}, None
            kind = k
            cur[name] = dur
            desc = d or desc
            if name.endswith(".total"):
                hops.append(Hop(kind, cur, desc))
                cur, desc = {}, None
    if cur:
        hops.append(Hop(kind, cur, desc))
    return Chain(hops)


def chain_of(entries: Mapping[str, float]) -> Chain:
    """``entries`` as a chain: itself when it is one, else grouped by prefix (a merged dict
    of one server and at most one hop of each other kind, as records before chains were)."""
    if isinstance(entries, Chain):
        return entries
    groups: dict[str, dict[str, float]] = {}
    for name, dur in entries.items():
        groups.setdefault(kind_of(name), {})[name] = dur
    order = sorted(groups, key=lambda k: (k != SERVER_KIND, k == GATEWAY_KIND))
    return Chain(Hop(k, groups[k]) for k in order)


def chain_from_record(hops: Iterable[Mapping[str, Any]] | None, entries: Mapping[str, float]) -> Chain:
    """A record's chain: its ``hops`` list when it has one, else its merged entries."""
    if hops:
        return Chain(Hop(str(h["kind"]), dict(h["entries"]), h.get("desc")) for h in hops)
    return chain_of(entries)


class Stopwatch:
    """Accumulates named durations measured with the monotonic clock."""

    __slots__ = ("_t0", "entries")

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
