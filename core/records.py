"""The per-request record: one line of ``records.jsonl`` per request ``pathprobe load`` sent.

This module is the schema's one definition. The load generator builds records of this type
(:func:`pathprobe.loadgen.recordbuild.build_record`) and the analysis reads them
(:func:`pathprobe.analysis.report.records.read_records`); neither needs Locust to import it. Every
duration is in milliseconds, measured on the client's monotonic clock unless noted. A key
of :class:`RequestRecord` is in every record; a key of the ``total=False`` part only where
it applies (streams, call-by-call interleaving).
"""

from __future__ import annotations

from typing import NotRequired

from pathprobe.segments import SEGMENTS
from typing_extensions import TypedDict  # typing's own cannot be validated by pydantic before 3.12

#: the additive segments of a split, then the network's share per side of the first hop
#: (the per-route metrics of a summary, one histogram each)
SPLIT_SEGMENTS = (*SEGMENTS, "network_hop1", "network_hop2")


class HopRecord(TypedDict):
    """One reporting hop's timing entries (:meth:`pathprobe.timing.Hop.as_dict`)."""

    kind: str  # entry prefix: "srv", "gw", or a third-party proxy's own
    desc: str | None  # what the hop said about itself (Server-Timing ``desc``)
    entries: dict[str, float]  # full entry names, e.g. "gw.upstream"


class HopPartRecord(TypedDict):
    """One reporting hop's own share of the request (:class:`pathprobe.segments.HopPart`)."""

    label: str
    total: float
    serialization: float
    other: float
    wait: NotRequired[float]  # its waits for its own loop, before its first timestamp and ``upwait`` (in queueing)
    upwait: NotRequired[float]  # of ``wait``, a forwarder's after its upstream answered (``<kind>.upwait``)


class SplitRecord(TypedDict):
    """The split of an OK request (:class:`pathprobe.segments.Split`): the six segments add up
    to ``e2e`` exactly; ``network_hop1 + network_hop2 == network``."""

    e2e: float
    network: float
    serialization: float
    queueing: float
    inference: float
    other: float
    unsplit: float  # inside a component that reports nothing (never guessed)
    network_hop1: float  # client <-> first hop
    network_hop2: float  # every link behind the first hop (0 when direct)
    links: list[float]  # network per link, outermost first
    hops: list[HopPartRecord]  # each reporting hop's own share, outermost first
    network_estimated: bool  # some link's network is an estimate (see links_estimated)
    client_wait: float  # the client's wait for its own event loop, booked in ``other``
    hop_wait: NotRequired[float]  # the hops' waits for their own loops, booked in ``queueing``
    links_estimated: list[bool]  # per link, as ``links``: its network is an estimate, not measured


class ServerReportRecord(TypedDict):
    """What a third-party server reported about the request (vLLM, TGI, Ollama)."""

    source: str
    entries: dict[str, float]  # as ``srv.*`` entries


class _Required(TypedDict):
    ts: float  # wall clock (s since the epoch) when the request was sent
    t0_wall_ns: int  # the request's start on CLOCK_REALTIME (ns), what packet captures stamp
    route: str  # e.g. "grpc.Generate", "openai.chat.stream" (``config/route`` in summaries under --mix)
    target: str  # the URL the request went to
    ok: bool
    status: str  # "OK", a gRPC status name, an HTTP status code, "STOPPED", "CLIENT_ERROR", ...
    error: str | None  # the error message (None when OK)
    e2e_ms: float  # send (before client encode) to the end of the response (after decode)
    latency_ms: float  # e2e + schedule lag: what a user of an open-loop run waited
    client_encode_ms: float  # the client's request serialization
    client_decode_ms: float  # the client's response deserialization (a stream: what held its end back)
    #: streams: of the measured decode, what overlapped the path's own work (left out of client_decode_ms:
    #: not on the request's path): the decode before the last chunk arrived (pathprobe.timing.held_back),
    #: and what a server without a total claims beyond the link (pathprobe.serverreports.decode_overlap)
    client_decode_overlap_ms: float
    ttft_ms: float | None  # streams: time to the first token chunk
    itl_ms: list[float]  # streams: gaps between token chunks (empty for unary calls)
    emit_ms: list[float] | None  # streams: the server's emit offset per token chunk (None: not reported)
    tpot_ms: float | None  # streams: (e2e - ttft) / (tokens_out - 1)
    tokens_in: int | None  # prompt tokens (the server's count, else the prompt set's)
    tokens_out: int | None  # completion tokens
    schedule_lag_ms: float  # open loop: how late the request left against its schedule
    client_wait_ms: float  # the client's wait for its own event loop on the first link
    entries: dict[str, float]  # every hop's timing entries merged by name
    hops: list[HopRecord]  # each reporting hop's entries, innermost (the server) first
    server_report: ServerReportRecord | None
    #: a round trip measured apart from the request, for a link whose far end reports nothing:
    #: an HTTP null round trip's median, else the transport floor (:mod:`pathprobe.rtt`)
    network_estimate_ms: float | None
    #: which estimate the split booked for a silent link (a :mod:`pathprobe.rtt` kind, or a
    #: forwarder's "<kind>.connect"); None when every link is measured
    network_estimate_kind: str | None
    network_floor_ms: float | None  # the transport floor: shortest TCP handshake / HTTP/2 PING
    split: SplitRecord | None  # OK requests only
    trace_id: str | None  # the CLIENT span's trace id when it was sampled and exported
    user: int  # the user (within its process) that sent it
    worker: str  # the Locust worker index, or "local"
    request_id: str  # sent with the request: ``worker-user-sequence``


class RequestRecord(_Required, total=False):
    """One request as ``pathprobe load`` writes it to ``records.jsonl``."""

    client_wait_total_ms: float  # streams: the client's loop wait summed over every resume
    config: str  # --mix: the configuration this call went to
    cycle: int  # --mix: the user's shuffled round the call belongs to
    trace_index: int  # --trace: the replayed request's index in the trace (sorted by arrival, from 0)
    session_id: str  # --sessions: the conversation the turn belongs to (``worker-user-n``)
    turn: int  # --sessions: the turn's index in its session, from 0 (turn 1+ carries the history)
    #: prompt tokens the server served from its prefix cache, as it reported them (OpenAI
    #: ``usage.prompt_tokens_details.cached_tokens``, native ``usage.cached_tokens``, gRPC
    #: ``Usage.cached_tokens``); absent when the server reports none (never guessed)
    cached_tokens: int
    #: the request's body as the client serialized it and the response's as it received it (bytes:
    #: gRPC message bytes, HTTP body / event-stream lines); absent where the client cannot see them
    #: (the OpenAI SDK) -- measured, never estimated from tokens
    request_bytes: int
    response_bytes: int


#: the keys every record has, and those some records have
REQUIRED_KEYS: frozenset[str] = RequestRecord.__required_keys__
OPTIONAL_KEYS: frozenset[str] = RequestRecord.__optional_keys__


#: how much of each record ``records.jsonl`` keeps: ``full`` (every key), or ``timing`` (every duration
#: and the split's segments and links; each hop's raw entries, the per-chunk lists and the hops'
#: shares emptied; under 1 KB a record whatever the stream's length). Summaries and histograms are
#: computed from the full record either way.
RECORD_DETAILS = ("full", "timing")


def timing_only(r: RequestRecord) -> RequestRecord:
    """``r`` with what ``timing`` detail leaves out emptied (same keys: the schema holds), and its
    durations rounded to the nanosecond, the clocks' own resolution (binary floats' last digits are
    noise, and most of a short record's bytes)."""
    out: RequestRecord = {**r, "entries": {}, "hops": [], "itl_ms": [], "emit_ms": None, "server_report": None}
    for key, value in out.items():
        if type(value) is float and key != "ts":
            out[key] = round(value, 6)  # type: ignore[literal-required]
    split = r["split"]
    if split is not None:
        trimmed: SplitRecord = {**split, "hops": [], "links": [round(x, 6) for x in split["links"]]}
        for key in (*SPLIT_SEGMENTS, "e2e", "client_wait"):
            trimmed[key] = round(split[key], 6)  # type: ignore[literal-required]
        out["split"] = trimmed
    return out
