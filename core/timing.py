"""In-band timing: durations in W3C ``Server-Timing`` syntax.

Every hop measures durations only, with a monotonic clock, and reports them as
``name;dur=1.234, other;dur=0.050`` (milliseconds). No absolute timestamp ever
crosses a process, so clock skew cannot corrupt a split.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
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
#: the part that held the stream's end back (:func:`held_back`). It is the link's stack time, like
#: a unary answer's hand-off after ``<kind>.total``: the split books it as network of the link
#: between the hop and its client, not as the hop's own time
SEND_PART = "send"
#: the entry prefix of a model server's hop
SERVER_KIND = "srv"
#: the entry prefix of a pathprobe gateway's hop
GATEWAY_KIND = "gw"


def now_ms() -> float:
    """Monotonic time in milliseconds (only differences are meaningful)."""
    return time.perf_counter_ns() / 1e6


def held_back(handoffs: Iterable[tuple[float, float]], last_ms: float) -> float:
    """The part of a stream's hand-offs (each chunk's ``(sent, resumed)`` on the hop's own transport)
    that held the stream's end back: what lies after ``last_ms``, the moment the hop had the last of
    what it forwards (a server: its engine's last token ready; a gateway: its upstream's last message
    seen). Before that, every wait overlapped the work upstream of it, which the hop's upstream time
    (or its engine's) already counts; counting it again would double it. This is ``<kind>.send``."""
    return sum(max(0.0, resumed - max(sent, last_ms)) for sent, resumed in handoffs)


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
