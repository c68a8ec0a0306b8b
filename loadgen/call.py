"""One call to a target: what to send (:class:`CallSpec`), what was measured (:class:`Outcome`)
and the interface every transport implements (:class:`Target`).

Each target fills an :class:`Outcome` in place, so a call interrupted by Locust (the test
stops while it is in flight) still leaves what was measured so far. Times are
``perf_counter_ns``. No Locust import here: targets are usable from any gevent (or plain
threaded) program.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pathprobe import timing
from pathprobe.serverreports import ServerReport

pc = time.perf_counter_ns
#: round trips a target times for its network floor (the shortest): TCP handshakes before an HTTP
#: target's first request, HTTP/2 PINGs after a gRPC call without entries
HANDSHAKE_PROBES = 3


@dataclass(slots=True)
class CallSpec:
    prompt: str
    max_tokens: int
    stream: bool
    ignore_eos: bool = True
    model: str = ""
    request_id: str = ""
    tokens_in: int | None = None  # the prompt set's count, used when the server reports none
    #: --sessions on OpenAI chat: the conversation so far (``prompt`` is then its concatenation)
    messages: list[dict[str, str]] | None = None
    keep_text: bool = False  # collect the reply's text into ``Outcome.text`` (a session's history)


@dataclass(slots=True)
class Outcome:
    t0: int = 0  # perf_counter_ns at send (before client encode; the client span's start when tracing)
    t_end: int = 0
    encode_ns: int = 0
    decode_ns: int = 0
    token_times: list[int] = field(default_factory=list)  # arrival of each chunk carrying tokens
    #: when the bytes carrying each of those chunks reached this host (the kernel's stamp of the read that
    #: returned it, perf_counter_ns: pathprobe.rxstamp); empty where the transport gives none
    token_rx: list[int] = field(default_factory=list)
    emit_ms: list[float] = field(default_factory=list)  # the server's emit offset of each of those chunks
    #: the outermost rebuilding gateway's hand-off offset of each of those chunks (0: none rebuilt it)
    fwd_ms: list[float] = field(default_factory=list)
    #: a stream's decode of each event, (start, end) in perf_counter_ns: only what lies after the last
    #: chunk's arrival counts as the client's decode (pathprobe.timing.held_back)
    decodes: list[tuple[int, int]] = field(default_factory=list)
    tokens_in: int | None = None
    tokens_out: int | None = None
    ok: bool = False
    status: str = ""
    error: str | None = None
    entries: timing.Chain = field(default_factory=timing.Chain)  # every hop's entries
    response_bytes: int = 0  # the response body (gRPC: message bytes; HTTP: body or event lines) as received
    request_bytes: int = 0  # the request body as serialized (gRPC: the message; HTTP: the JSON body)
    #: a round trip measured apart from the request, the network estimate of a link whose far end
    #: reports nothing: an HTTP null round trip's median on the same connection (HTTP), else the
    #: floor below; which one is ``network_estimate_kind`` (:mod:`pathprobe.rtt`)
    network_estimate_ms: float | None = None
    network_estimate_kind: str | None = None
    #: the transport floor: the shortest TCP handshake (HTTP/1.1) or HTTP/2 PING (gRPC)
    network_floor_ms: float | None = None
    #: what a third-party server reported about the request itself (vLLM, TGI, Ollama)
    server_report: ServerReport | None = None
    #: prompt tokens the server served from its prefix cache, when it reports them (OpenAI
    #: ``usage.prompt_tokens_details.cached_tokens``, native ``usage.cached_tokens``, gRPC
    #: ``Usage.cached_tokens``); None: not reported
    cached_tokens: int | None = None
    text: list[str] = field(default_factory=list)  # the reply's pieces (only with ``CallSpec.keep_text``)


def usage_cached_tokens(usage: object) -> int | None:
    """``cached_tokens`` of a JSON ``usage`` object: OpenAI's ``prompt_tokens_details.cached_tokens``
    or a top-level ``cached_tokens``; None when neither is there (never guessed)."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    if value is None:
        value = usage.get("cached_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Target:
    """A transport to one target; one call at a time (each user holds its own)."""

    kind = "?"
    address = ""

    def route(self, stream: bool) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def call(self, spec: CallSpec, headers: dict[str, str], out: Outcome) -> None:  # pragma: no cover
        raise NotImplementedError

    def read_age_ms(self) -> float | None:
        """How long the bytes of the call's last read had waited in the kernel for this client (ms),
        a bound on the client's wait for them (:mod:`pathprobe.rxstamp`); None: not known."""
        return None

    def after_call(self, out: Outcome) -> None:
        """Called after the request is recorded as done (outside its e2e and its client wait):
        where a target times round trips for the network estimate of a silent server."""
        return None

    def close(self) -> None:
        return None
