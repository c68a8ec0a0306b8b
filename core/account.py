"""One request's accounting, the one entry point: the chain, the split, the estimate's kind, overlaps.

The recipe (docs/design.md, the segment model) in one function, :func:`account`, which the load
generator's records (:func:`pathprobe.loadgen.recordbuild.build_record`), trace analysis
(:func:`pathprobe.analysis.report.tracesplit.split_trace`) and the compare analysis all call:

1. the hops' entries as a chain, with a third-party server's own report as its innermost hop when
   that report has a total (:func:`pathprobe.serverreports.with_report`);
2. on a stream, the client's decode that must have overlapped what a server without a total
   measured (:func:`pathprobe.serverreports.decode_overlap`) is left out of the client's decode;
3. the network estimate of a silent innermost link (:func:`pathprobe.serverreports.network_estimate`);
4. the split (:func:`pathprobe.serverreports.split` over :func:`pathprobe.segments.split`) and
   which estimate it booked (:func:`pathprobe.serverreports.network_estimate_kind`), when any.

The chain is made once, here. The split itself stays in :mod:`pathprobe.segments` (this module
only assembles its inputs), so :mod:`pathprobe.segments` keeps no dependency on the readers of
third-party reports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pathprobe import serverreports
from pathprobe.segments import Split
from pathprobe.serverreports import ServerReport
from pathprobe.timing import Chain, Interval, handed_over_ms, held_back, last_arrival, last_waited, read_backlog


@dataclass(frozen=True, slots=True)
class Account:
    """What :func:`account` returns."""

    split: Split
    #: the hops, innermost first, with a third-party server's report as its hop when it has a total
    chain: Chain
    #: the estimator of a silent link's network (:mod:`pathprobe.rtt` kinds, or a forwarder's
    #: ``<kind>.connect``); None when every link is measured
    network_estimate_kind: str | None
    #: the client's decode the split used (its measured decode less ``decode_overlap_ms``)
    client_decode_ms: float
    #: of the stream's measured client decode, what overlapped the server's own measured work
    decode_overlap_ms: float


def account(
    e2e_ms: float,
    entries: Mapping[str, float],
    report: ServerReport | None = None,
    *,
    client_encode_ms: float = 0.0,
    client_decode_ms: float = 0.0,
    stream: bool = False,
    client_estimate_ms: float | None = None,
    client_estimate_kind: str | None = None,
    client_wait_ms: float = 0.0,
    client_decodes: Sequence[Interval] = (),
    client_arrivals: Sequence[tuple[float, float | None]] = (),
    client_received: Sequence[float] = (),
) -> Account:
    """Account for one OK request.

    ``entries``: the hops' in-band entries (a :class:`~pathprobe.timing.Chain` or a merged mapping);
    ``report``: what a server we did not write reported; ``client_estimate_ms`` / ``_kind``: the
    client's own round trip measured apart (the estimate of a direct path's silent server);
    ``client_wait_ms``: the client's wait for its own event loop (an upper bound; the split caps it).
    ``client_decodes`` / ``client_arrivals``: a stream's decode of each event (intervals, ms since the
    request's start) and each token chunk's (arrival, the server's emit offset or None): the client's
    decode counts only where it held the stream's end back (after the last chunk arrived, never before
    the outermost hop was done: :func:`pathprobe.timing.last_arrival`, :func:`~pathprobe.timing.held_back`),
    and its reads of chunks already waiting when it was behind are its own time, like its loop wait.
    ``client_received``: per token chunk, when its bytes reached the client's host (the kernel's
    receive stamps, :mod:`pathprobe.rxstamp`; ms since the request's start), where the
    transport gives them: the last chunk's arrival is then measured, not bounded from the pacing.
    """
    chain = serverreports.with_report(entries, report)
    overlap = 0.0
    if stream and client_decodes and client_arrivals:
        outer_done = client_encode_ms + _outer_own_ms(chain)
        last = _client_last_arrival(client_arrivals, client_received, client_decodes, outer_done)
        # the last chunk can be seen before the outermost hop is done (a relay still forwarding the
        # trailers): decode before that instant overlapped the hop's own time, which it holds
        held = min(held_back(client_decodes, max(last, outer_done)), client_decode_ms)
        overlap = client_decode_ms - held
        behind = read_backlog(client_arrivals[-1][0], last, client_decodes)
        client_wait_ms = max(client_wait_ms, behind)  # both are its own time on its link: never twice
    if stream:  # decode that ran while the server was still producing: not on the path
        overlap += serverreports.decode_overlap(e2e_ms, chain, report, client_encode_ms, client_decode_ms - overlap)
    dec = client_decode_ms - overlap
    est = serverreports.network_estimate(chain, client_estimate_ms)
    s = serverreports.split(
        e2e_ms, chain, report, client_encode_ms, dec, network_estimate_ms=est, client_wait_ms=client_wait_ms
    )
    kind = serverreports.network_estimate_kind(chain, client_estimate_kind) if s.network_estimated else None
    return Account(s, chain, kind, dec, overlap)


def _client_last_arrival(
    arrivals: Sequence[tuple[float, float | None]],
    received: Sequence[float],
    decodes: Sequence[Interval],
    outer_done: float,
) -> float:
    """When a stream's last chunk reached the client: its kernel stamp where every chunk has one (never
    before the outermost hop was done, never after the client had it), else the bound from the chunks'
    pacing and the client's own waits (:func:`~pathprobe.timing.last_arrival`)."""
    if received and len(received) == len(arrivals):
        return min(max(received[-1], outer_done), arrivals[-1][0])
    waited = last_waited([s for s, _ in arrivals], decodes)
    return last_arrival(arrivals, max(outer_done, waited))


def _outer_own_ms(chain: Chain) -> float:
    """The outermost reporting hop's earliest hand-off of the last chunk (:func:`~pathprobe.timing.handed_over_ms`);
    -inf: none reports."""
    hops = [h for h in chain.hops if h.has("total")]
    return handed_over_ms(hops[-1]) if hops else -math.inf
