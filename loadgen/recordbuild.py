"""One measured call (:class:`~pathprobe.loadgen.call.Outcome`) -> its record
(:class:`pathprobe.records.RequestRecord`, one line of ``records.jsonl``).

The split is computed here, per request, from the client's own times and the hops' timing
entries (:mod:`pathprobe.segments`). No Locust import: the same record comes out of any
program that drives a target.
"""

from __future__ import annotations

import itertools
import time

from pathprobe.account import account
from pathprobe.loadgen.call import CallSpec, Outcome, pc
from pathprobe.records import HopRecord, RequestRecord, SplitRecord
from pathprobe.segments import Split
from pathprobe.serverreports import with_report
from pathprobe.timing import Hop, pacing


def build_record(
    out: Outcome,
    spec: CallSpec,
    route: str,
    host: str,
    ts: float,
    lag_ns: int,
    user: int,
    worker: str,
    client_wait_ms: float = 0.0,
) -> RequestRecord:
    """``out`` of a call made for ``spec`` to ``host`` (sent at wall time ``ts``, ``lag_ns`` late
    against an open-loop schedule) by ``user`` of ``worker``; ``client_wait_ms``: how long the
    response waited for this process's event loop (booked as the client's, never network)."""
    e2e = (out.t_end - out.t0) / 1e6
    enc = out.encode_ns / 1e6
    dec = out.decode_ns / 1e6
    lag = lag_ns / 1e6
    times = out.token_times
    ttft: float | None = None
    itl: list[float] | None = None
    tpot: float | None = None
    if spec.stream:
        if times:
            ttft = (times[0] - out.t0) / 1e6
            itl = [(b - a) / 1e6 for a, b in itertools.pairwise(times)]
        else:
            itl = []
        n = out.tokens_out or 0
        if ttft is not None and n > 1:
            tpot = (e2e - ttft) / (n - 1)
    rep = out.server_report
    t0 = out.t0
    emit = out.emit_ms if spec.stream and len(out.emit_ms) == len(times) and all(out.emit_ms) else None
    pace = pacing(out.emit_ms, out.fwd_ms, len(times)) if spec.stream else None  # what paced them to us
    overlap = 0.0
    sp: SplitRecord | None = None
    kind: str | None = None
    if out.ok:
        acc = account(
            e2e,
            out.entries,
            rep,
            client_encode_ms=enc,
            client_decode_ms=dec,
            stream=spec.stream,
            client_estimate_ms=out.network_estimate_ms,
            client_estimate_kind=out.network_estimate_kind,
            client_wait_ms=client_wait_ms,
            client_decodes=[((a - t0) / 1e6, (b - t0) / 1e6) for a, b in out.decodes] if spec.stream else (),
            client_arrivals=[((t - t0) / 1e6, pace[i] if pace else None) for i, t in enumerate(times)]
            if spec.stream
            else (),
            client_received=[(t - t0) / 1e6 for t in out.token_rx] if len(out.token_rx) == len(times) else (),
        )
        chain = acc.chain
        sp, kind, client_wait_ms = split_record(acc.split), acc.network_estimate_kind, acc.split.client_wait
        dec, overlap = acc.client_decode_ms, acc.decode_overlap_ms
    else:
        chain = with_report(out.entries, rep)
    rec: RequestRecord = {
        "ts": ts,
        # t0 on the wall clock (CLOCK_REALTIME, what packet captures stamp), from the monotonic t0 and
        # the two clocks' offset read now: it moves only by NTP slewing (<= 0.05% of the request's time)
        "t0_wall_ns": out.t0 + time.time_ns() - pc(),
        "route": route,
        "target": host,
        "ok": out.ok,
        "status": out.status,
        "error": out.error,
        "e2e_ms": e2e,
        "latency_ms": e2e + lag,
        "client_encode_ms": enc,
        "client_decode_ms": dec,
        # of the stream's measured decode, what overlapped the path's own work (left out of client_decode_ms)
        "client_decode_overlap_ms": overlap,
        "ttft_ms": ttft,
        "itl_ms": itl if itl is not None else [],
        # the server's emit offset of each token chunk (ms since it got the request; None: not reported)
        "emit_ms": emit,
        "tpot_ms": tpot,
        "tokens_in": out.tokens_in if out.tokens_in is not None else spec.tokens_in,
        "tokens_out": out.tokens_out,
        "schedule_lag_ms": lag,
        "client_wait_ms": client_wait_ms,
        "entries": out.entries,
        "hops": [hop_record(hop) for hop in chain.hops],
        "server_report": {"source": rep.source, "entries": rep.entries} if rep is not None else None,
        "network_estimate_ms": out.network_estimate_ms,
        # which estimate the split booked for a silent link (pathprobe.rtt kinds, or a forwarder's
        # "<kind>.connect"), None when every link is measured; the transport floor beside it
        "network_estimate_kind": kind,
        "network_floor_ms": out.network_floor_ms,
        "split": sp,
        "trace_id": None,
        "user": user,
        "worker": worker,
        "request_id": spec.request_id,
    }
    if out.request_bytes:
        rec["request_bytes"] = out.request_bytes
        rec["response_bytes"] = out.response_bytes
    return rec


def split_record(s: Split) -> SplitRecord:
    """The split as the record holds it (Split.as_dict(), dataclasses.asdict, costs ~18 us;
    the same dict built directly a fraction of that)."""
    return {
        "e2e": s.e2e,
        "network": s.network,
        "serialization": s.serialization,
        "queueing": s.queueing,
        "inference": s.inference,
        "other": s.other,
        "unsplit": s.unsplit,
        "network_hop1": s.network_hop1,
        "network_hop2": s.network_hop2,
        "links": list(s.links),
        "hops": [
            {
                "label": h.label,
                "total": h.total,
                "serialization": h.serialization,
                "other": h.other,
                "wait": h.wait,
                "upwait": h.upwait,
            }
            for h in s.hops
        ],
        "network_estimated": s.network_estimated,
        "client_wait": s.client_wait,
        "hop_wait": s.hop_wait,
        "links_estimated": list(s.links_estimated),
    }


def hop_record(hop: Hop) -> HopRecord:
    """A reporting hop's entries as the record holds them (what :meth:`Hop.as_dict` gives)."""
    return {"kind": hop.kind, "desc": hop.desc, "entries": dict(hop.entries)}
