"""The segment model: split one request's end-to-end time into six parts.

network + serialization + queueing + inference + other + unsplit == e2e, exactly, for
every request. See docs/design.md (the segment model); this module is its only
implementation, used by the load generator and by trace analysis alike, both through one entry
point, :func:`pathprobe.account.account` (the chain with a server's report, the client's stream
decode by the one rule for per-chunk costs, the network estimate and its kind, then this split).

The path is a chain of hops (:class:`pathprobe.timing.Chain`), innermost first: a model
server (``srv.*``) and any number of forwarding hops (a pathprobe gateway ``gw.*``, or a
third-party proxy that reports its own prefix). The client measures e2e and its own
encode/decode; every link between two neighbours is measured as what the outer one saw
its upstream take minus what the inner one reports as its total, plus what the inner one
reports as ``<kind>.send``: on a stream, the time its handler waited on its own transport to
take the chunks it sent towards the outer one after it had the last of them
(:func:`pathprobe.timing.held_back`; earlier waits overlapped the work behind it). That wait is
the transport's (a gRPC stack's write completion and loop wake-up per message), so it is the
link's stack time as a unary answer's hand-off is (after the hop's total); left in the hop's
own time, it would make the hop's "other" follow whatever else the machine ran while the
stream was sent. A server's ``srv.body`` (its wait for the request body's bytes after the headers,
:data:`pathprobe.timing.BODY_PART`) is link time the same way, booked on the link to it, or behind
hops that forward request bodies as they come (:data:`STREAMS_REQUEST_BODY`) on a link in front of
them (:func:`_body_link`).

Nothing is guessed: when the innermost component reports nothing (a third-party server,
or a forwarder whose upstream is silent), the innermost link's time holds both network
and that component's work and cannot be split. It is booked as **unsplit**, except a
round trip measured apart (``network_estimate_ms``: an HTTP null round trip on the client's own
connection, an HTTP/2 PING, a TCP connect), which is booked as network of that link only and
flagged per link (``links_estimated``; ``network_estimated`` says whether any link is).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from pathprobe.timing import BODY_PART, SEND_PART, SERVER_KIND, UPWAIT_PART, WAIT_PART, Chain, Hop, chain_of

SEGMENTS = ("network", "serialization", "queueing", "inference", "other", "unsplit")
#: parts of a server's total that are the model's own work (``srv.inference``: a server
#: that reports one figure for the whole of it, e.g. TGI's ``x-inference-time``)
#: the clock resolution (ms) of a hop kind whose figures are coarser than the rest of the chain's:
#: nginx's ``$request_time`` and ``$upstream_response_time`` have 1 ms resolution, each read from a
#: clock it caches per event-loop turn. Where such a hop's figures contradict a precise neighbour's
#: by no more than that, they are brought within it (:func:`_within_resolution`): 2048-token streams
#: through nginx had its client link down to -0.44 ms or its own time -1.0 in 35 of 267 records.
#: A contradiction beyond it is left, to be seen; a precise hop's figures are never touched.
CLOCK_RESOLUTION_MS = {"nginx": 1.0}

#: forwarding hops that pass a request's body on as it comes, having called their upstream with its
#: headers, as (kind, desc); desc None: whatever it says. nginx's ``grpc_pass`` never buffers a request
#: body (its ``proxy_pass`` does by default: ``desc=proxy_pass``); HAProxy forwards it as it comes
#: unless ``option http-buffer-request``. Behind them a server's wait for its body (``srv.body``) may
#: be the time the body took to reach them: a 16k-token prompt through nginx over a delayed client
#: link crosses that link in two round trips (HTTP/2 flow control), and the second lay in nginx's
#: upstream call, +5.05 ms on the server link for 5 on the client link (2026-12-04). Or it may be the
#: server link's own: with that link delayed, one record in five had the body trail its headers by the
#: link's one-way delay. Neither side reports when the body's last byte passed the proxy. These
#: proxies take a body from their client through a small HTTP/2 window (64 KB), so the client's link
#: paces it: the wait goes to the outermost link it crossed, unless a link inside took more than
#: :data:`BODY_SLOWER` times that link's own time (a body held back by flow control waits for round
#: trips of the slow link; on loopback the links' own times differ by up to 2-3x, a delayed link's by
#: 10x or more): :func:`_body_link`. The factor is a choice, not a measurement: a 131072-token prompt
#: trails its headers by ~0.6 ms through nginx on loopback (1-4 through HAProxy), paced by both links
#: and the proxy at once, and which link takes it moved a paired "still" link by -0.35 ms with a factor
#: of 2, -0.26 with 3, -1.0 (HAProxy) with 4 (docs/results/2026-12-04-request-body.md).
STREAMS_REQUEST_BODY = frozenset({("nginx", "grpc_pass"), ("haproxy", None)})
BODY_SLOWER = 3.0

INFERENCE_PARTS = ("srv.tokenize", "srv.prefill", "srv.decode_steps", "srv.detokenize", "srv.inference")
SERIALIZATION_PARTS = ("decode", "encode")


@dataclass(frozen=True, slots=True)
class HopPart:
    """One reporting hop's own share of the request (ms)."""

    label: str
    total: float
    serialization: float
    other: float  # its time outside serialization, its upstream, its send and (server) queue/inference
    #: its waits for its own event loop, booked as queueing: before its first timestamp (``<kind>.wait``)
    #: and, of a forwarder, after its upstream answered (``upwait``)
    wait: float = 0.0
    #: of ``wait``, the part after its upstream answered (``<kind>.upwait``, taken from the link below)
    upwait: float = 0.0


@dataclass(frozen=True, slots=True)
class Split:
    e2e: float
    network: float
    serialization: float
    queueing: float
    inference: float
    other: float
    unsplit: float  # time inside a component that reports nothing (never guessed)
    network_hop1: float  # client <-> first hop (gateway, or server when direct)
    network_hop2: float  # every link behind the first hop (0 when direct)
    links: tuple[float, ...] = ()  # network per link, outermost first (client <-> first hop, ...)
    hops: tuple[HopPart, ...] = ()  # each reporting hop's own share, outermost first
    network_estimated: bool = False  # some link's network is an estimate (see links_estimated)
    client_wait: float = 0.0  # the client's own wait for its event loop, in ``other`` (never network)
    #: the hops' waits for their own event loops before their first timestamps (``<kind>.wait``), in
    #: ``queueing``: each capped at the network of the link to its hop, which it is taken from
    hop_wait: float = 0.0
    #: per link, outermost first (as ``links``): whether its network is an estimate (a round trip
    #: measured apart) rather than measured (e.g. client -> gateway measured, gateway -> silent server
    #: estimated: ``(False, True)``)
    links_estimated: tuple[bool, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _serialization(hop: Hop) -> float:
    return sum(hop.get(part) for part in SERIALIZATION_PARTS)


def _server_part(hop: Hop) -> tuple[HopPart, float, float]:
    """A server's share and its (queueing, inference)."""
    queue = hop.get("queue")
    inference = sum(hop.entries.get(name, 0.0) for name in INFERENCE_PARTS)
    ser = _serialization(hop)
    total = hop.get("total")
    own = total - ser - queue - inference - hop.get(SEND_PART) - hop.get(BODY_PART)
    return HopPart(hop.label, total, ser, own), queue, inference


def _forwarder_part(hop: Hop) -> HopPart:
    ser = _serialization(hop)
    total = hop.get("total")
    return HopPart(hop.label, total, ser, total - hop.get("upstream") - ser - hop.get(SEND_PART))


def _within_resolution(hop: Hop, outer_ms: float, inner_ms: float | None, res: float) -> Hop:
    """``hop``'s total and upstream brought within what its neighbours measured, where they contradict
    them by no more than the hop's clock resolution ``res``: its total (less its send) no longer than
    its outer side saw it take (``outer_ms``, the link to it >= 0), its upstream no shorter than its
    inner hop's total (``inner_ms``, less that hop's send: the link below >= 0) and no longer than its
    own total leaves room for (its own time >= 0). Where its total leaves no room for its inner hop's,
    its total is raised to it, as far as its outer side allows."""
    total, up = hop.get("total"), hop.get("upstream")
    send, ser = hop.get(SEND_PART), _serialization(hop)
    if 0 < total - send - outer_ms <= res:
        total = outer_ms + send
    entries = dict(hop.entries)
    if hop.has("upstream"):
        if inner_ms is not None and 0 < inner_ms - up <= res:
            up = inner_ms
        room = total - ser - send
        if 0 < up - room <= res:
            if inner_ms is None or room >= inner_ms:
                up = room
            elif inner_ms - room <= res and inner_ms + ser <= outer_ms:
                up, total = inner_ms, inner_ms + ser + send
        entries[f"{hop.kind}.upstream"] = up
    entries[f"{hop.kind}.total"] = total
    return replace(hop, entries=entries)


def _streams_body(hop: Hop) -> bool:
    return (hop.kind, hop.desc) in STREAMS_REQUEST_BODY or (hop.kind, None) in STREAMS_REQUEST_BODY


def _body_links(hops: list[Hop], i: int, link: int) -> list[int]:
    """The links (indices into ``links``, outermost first) a body wait of ``hops[i]`` can have been spent
    on: its own (``link``) and, behind hops that stream request bodies, each one in front of them."""
    out = [link]
    while i + 1 < len(hops) and _streams_body(hops[i + 1]):
        i, link = i + 1, link - 1
        out.append(link)
    return out


def _body_link(links: list[float], candidates: list[int]) -> int:
    """Of the links a body wait can have been spent on (innermost first), the outermost, unless another
    took more than :data:`BODY_SLOWER` times its own time: that one held the body back."""
    outer = candidates[-1]
    slowest = max(candidates, key=lambda c: links[c])
    return slowest if links[slowest] > BODY_SLOWER * max(links[outer], 0.0) else outer


def _hop_wait(hop: Hop, link_ms: float) -> float:
    """A hop's wait for its own loop (``<kind>.wait``, an upper bound), capped at its link's time."""
    wait = hop.get(WAIT_PART)
    return min(wait, link_ms) if wait > 0 and link_ms > 0 else 0.0


def _outer_upwait(parts: list[HopPart], link_ms: float) -> float:
    """The outer hop's wait for its own loop after its upstream answered (``<kind>.upwait``, an upper
    bound inside its ``upstream``), capped at the link to that upstream; added to the outer hop's
    ``wait`` in ``parts`` (its queueing). 0 for the outermost hop's link (the client's)."""
    if not parts or parts[-1].upwait <= 0:
        return 0.0
    up = min(parts[-1].upwait, max(link_ms, 0.0))
    parts[-1] = replace(parts[-1], wait=parts[-1].wait + up, upwait=up)
    return up


def _inner_link(time_ms: float, estimate_ms: float | None) -> tuple[float, float]:
    """(network, unsplit) of a link whose far end reports nothing."""
    if estimate_ms is None:
        return 0.0, time_ms
    net = min(max(estimate_ms, 0.0), max(time_ms, 0.0))
    return net, time_ms - net


def split(
    e2e_ms: float,
    entries: Mapping[str, float],
    client_encode_ms: float = 0.0,
    client_decode_ms: float = 0.0,
    *,
    network_estimate_ms: float | None = None,
    client_wait_ms: float = 0.0,
) -> Split:
    """Split ``e2e_ms`` using the hops' in-band entries.

    ``entries`` is a :class:`~pathprobe.timing.Chain` (every hop apart) or a merged
    ``{name: dur}`` mapping (one server and at most one hop of each other kind).
    ``network_estimate_ms``: a transport round trip measured on the innermost link, used
    only where that link ends in a component that reports nothing.
    ``client_wait_ms``: how long the client's own event loop kept the response waiting
    (:mod:`pathprobe.loadgen.clientwait`); it is the client's time, not the link's, so it moves
    from the client's link to ``other`` -- capped at that link's time (an upper bound cannot
    take more than the link took).
    """
    chain: Chain = chain_of(entries)
    hops = [h for h in chain.hops if h.has("total")]
    client_ser = client_encode_ms + client_decode_ms
    serialization = client_ser
    queueing = inference = other = unsplit = 0.0
    parts: list[HopPart] = []
    links: list[float] = []
    estimated = False

    hop_wait = 0.0
    outer_time = e2e_ms - client_ser  # what the client saw its upstream take
    for i in range(len(hops) - 1, -1, -1):  # outermost first
        hop = hops[i]
        res = CLOCK_RESOLUTION_MS.get(hop.kind, 0.0)
        if res:
            inner = hops[i - 1].get("total") - hops[i - 1].get(SEND_PART) if i > 0 else None
            hop = _within_resolution(hop, outer_time, inner, res)
        # the link to this hop: what the outer side saw it take, less the hop's own time (its total
        # without the waits on its transport for the chunks it streamed back: those are the link's),
        # less the hop's wait for its own loop before its first timestamp (its queueing) and the outer
        # hop's wait for its loop after this hop had answered (the outer hop's queueing)
        link = outer_time - hop.get("total") + hop.get(SEND_PART) + hop.get(BODY_PART)
        wait = _hop_wait(hop, link)
        up = _outer_upwait(parts, link - wait)
        links.append(link - wait - up)
        body = min(hop.get(BODY_PART), max(links[-1], 0.0))
        if body > 0:  # its wait for the body's bytes: the link's, or one in front of hops that stream it
            links[-1] -= body
            links[_body_link(links, _body_links(hops, i, len(links) - 1))] += body
        queueing += wait + up
        hop_wait += wait + up
        if hop.kind == SERVER_KIND and i == 0:
            part, queue, inference = _server_part(hop)
            queueing += queue
            part = HopPart(part.label, part.total, part.serialization, part.other, wait)
            parts.append(part)
            serialization += part.serialization
            other += part.other
            outer_time = 0.0
            break
        part = _forwarder_part(hop)
        # its wait after its upstream answered is booked (capped) with the link below it
        part = HopPart(part.label, part.total, part.serialization, part.other, wait, hop.get(UPWAIT_PART))
        parts.append(part)
        serialization += part.serialization
        other += part.other
        if not hop.has("upstream"):  # reports its total only: what it forwarded to is inside it
            other -= part.other
            unsplit += part.other
            parts[-1] = HopPart(part.label, part.total, part.serialization, 0.0, wait)
            outer_time = 0.0
            break
        outer_time = hop.get("upstream")
    else:
        # the innermost component reports nothing: the last link is network + its work, less the
        # outer hop's wait for its loop after the answer came (measured by that hop, its queueing)
        up = _outer_upwait(parts, outer_time)
        outer_time -= up
        queueing += up
        hop_wait += up
        net, rest = _inner_link(outer_time, network_estimate_ms)
        estimated = network_estimate_ms is not None
        links.append(net)
        unsplit += rest

    wait = min(client_wait_ms, links[0]) if links and links[0] > 0 and client_wait_ms > 0 else 0.0
    if wait:
        links[0] -= wait
        other += wait
    network = sum(links)
    return Split(
        e2e=e2e_ms,
        network=network,
        serialization=serialization,
        queueing=queueing,
        inference=inference,
        other=other,
        unsplit=unsplit,
        network_hop1=links[0] if links else 0.0,
        network_hop2=sum(links[1:], 0.0),
        links=tuple(links),
        hops=tuple(parts),
        network_estimated=estimated,
        client_wait=wait,
        hop_wait=hop_wait,
        links_estimated=tuple(estimated and j == len(links) - 1 for j in range(len(links))),
    )
