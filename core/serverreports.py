"""What model servers we did not write report about each request, read as our server's entries.

Each reader takes one server's own per-request report and returns a :class:`ServerReport`:
``srv.*`` entries (the names pathprobe's own server uses, so the segment model books them
the same way: ``srv.queue`` -> queueing, ``srv.prefill`` / ``srv.decode_steps`` /
``srv.inference`` -> inference, the rest of ``srv.total`` -> other) and a label naming
the source. Nothing is derived that the server did not measure:

==================  ===========================================  ================================
server              where (unit)                                 entries
==================  ===========================================  ================================
vLLM                response ``metrics`` object, with            ``srv.queue`` = queue_time_ms,
                    ``--enable-per-request-metrics`` (ms);       ``srv.prefill`` =
                    unary body, or the final usage chunk of a    time_to_first_token_ms,
                    stream (``/v1/completions``,                 ``srv.decode_steps`` =
                    ``/v1/chat/completions``)                    generation_time_ms; no total
TGI                 ``x-total-time``, ``x-validation-time``,     ``srv.total``, ``srv.validation``
                    ``x-queue-time``, ``x-inference-time``       (other), ``srv.queue``,
                    headers (whole ms; ``/generate``,            ``srv.inference``
                    ``/v1/completions``, ``/v1/chat/
                    completions`` without streaming)
Ollama              ``total_duration``, ``load_duration``,       ``srv.total``, ``srv.load``
                    ``prompt_eval_duration``, ``eval_duration``  (other: its scheduler wait and
                    (ns; ``/api/generate``, ``/api/chat``, the   model load), ``srv.prefill``,
                    final object of a stream)                    ``srv.decode_steps``
==================  ===========================================  ================================

vLLM 0.32 measures its intervals inside the engine (``queued_ts`` -> ``scheduled_ts`` ->
``first_token_ts`` -> ``last_token_ts``): its HTTP handling, tokenization and output
processing are in no figure, so a vLLM report has no total (:attr:`ServerReport.has_total`
is false) and the rest of the server's time stays unsplit. TGI and Ollama time their
handler from start to end: their total is the server's total.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pathprobe import segments
from pathprobe.errors import PathprobeError
from pathprobe.timing import SERVER_KIND, Chain, Hop, chain_of

#: the labels of the readers (a record's hop ``desc``)
VLLM = "vLLM per-request metrics"
TGI = "TGI x-*-time headers"
OLLAMA = "Ollama *_duration"

#: TGI header -> entry
TGI_HEADERS = {
    "x-total-time": "srv.total",
    "x-validation-time": "srv.validation",
    "x-queue-time": "srv.queue",
    "x-inference-time": "srv.inference",
}
_OLLAMA_FIELDS = {
    "total_duration": "srv.total",
    "load_duration": "srv.load",
    "prompt_eval_duration": "srv.prefill",
    "eval_duration": "srv.decode_steps",
}
#: vLLM's OTLP span for one request (``--otlp-traces-endpoint``) and its attributes (seconds)
VLLM_SPAN = "llm_request"
_VLLM_SPAN_ATTRS = {
    "gen_ai.latency.time_in_queue": "srv.queue",
    "gen_ai.latency.time_in_model_prefill": "srv.prefill",
    "gen_ai.latency.time_in_model_decode": "srv.decode_steps",
}
#: its source label (the same intervals as the response's metrics, read from the trace)
VLLM_TRACE = "vLLM llm_request span"
_VLLM_FIELDS = {
    "queue_time_ms": "srv.queue",
    "time_to_first_token_ms": "srv.prefill",
    "generation_time_ms": "srv.decode_steps",
}


class ReportError(PathprobeError):
    """A server's report is present but unreadable (names the field)."""


@dataclass(frozen=True, slots=True)
class ServerReport:
    """A server's own account of one request, as ``srv.*`` entries (ms)."""

    source: str
    entries: dict[str, float] = field(default_factory=dict)

    @property
    def has_total(self) -> bool:
        """Whether the server reported its whole handling time (``srv.total``)."""
        return "srv.total" in self.entries

    @property
    def known_ms(self) -> float:
        """Queueing + inference the server measured (what can be booked without a total)."""
        return sum(
            v for k, v in self.entries.items() if k in ("srv.queue", "srv.prefill", "srv.decode_steps", "srv.inference")
        )


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ReportError(f"{where}: expected a number, got {value!r}")
    try:
        out = float(value)
    except ValueError:
        raise ReportError(f"{where}: expected a number, got {value!r}") from None
    if not out >= 0:  # also rejects NaN
        raise ReportError(f"{where}: expected a duration >= 0, got {value!r}")
    return out


def from_vllm(body: Mapping[str, object]) -> ServerReport | None:
    """vLLM's ``metrics`` object of a response (or of the final chunk of a stream)."""
    metrics = body.get("metrics") if isinstance(body, Mapping) else None
    if metrics is None:
        return None
    if not isinstance(metrics, Mapping):
        raise ReportError(f"metrics: expected an object, got {type(metrics).__name__}")
    entries = {
        name: _number(metrics[key], f"metrics.{key}")
        for key, name in _VLLM_FIELDS.items()
        if metrics.get(key) is not None
    }
    return ServerReport(VLLM, entries) if entries else None


def from_vllm_span(attributes: Mapping[str, object]) -> ServerReport | None:
    """vLLM's ``llm_request`` span attributes (``gen_ai.latency.*``, seconds) as a report.

    vLLM times these in its engine, like its response ``metrics``: no total (its
    ``gen_ai.latency.e2e`` starts when the engine got the request, not when the server did)."""
    entries = {
        name: _number(attributes[key], key) * 1000.0
        for key, name in _VLLM_SPAN_ATTRS.items()
        if attributes.get(key) is not None
    }
    return ServerReport(VLLM_TRACE, entries) if entries else None


def from_tgi(headers: Mapping[str, str]) -> ServerReport | None:
    """TGI's timing headers (whole milliseconds); ``None`` when there is no ``x-total-time``."""
    low = {k.lower(): v for k, v in headers.items()}
    if "x-total-time" not in low:
        return None
    entries = {name: _number(low[key], key) for key, name in TGI_HEADERS.items() if key in low}
    return ServerReport(TGI, entries)


def from_ollama(body: Mapping[str, object]) -> ServerReport | None:
    """Ollama's ``*_duration`` fields (nanoseconds); ``None`` when there is no ``total_duration``."""
    if not isinstance(body, Mapping) or body.get("total_duration") is None:
        return None
    entries = {name: _number(body[key], key) / 1e6 for key, name in _OLLAMA_FIELDS.items() if body.get(key) is not None}
    return ServerReport(OLLAMA, entries)


def read(headers: Mapping[str, str] | None, body: Mapping[str, object] | None) -> ServerReport | None:
    """The first report found in a response: vLLM's body metrics, TGI's headers, Ollama's fields."""
    if body is not None:
        for reader in (from_vllm, from_ollama):
            rep = reader(body)
            if rep is not None:
                return rep
    if headers:
        return from_tgi(headers)
    return None


# --- the split ---------------------------------------------------------------------------------
def with_report(chain: Mapping[str, float], report: ServerReport | None) -> Chain:
    """``chain`` with a server's own report as its innermost hop, when that report has a total.

    A report with a total (TGI, Ollama) is a server hop like ours: its ``srv.total`` closes the
    innermost link, whose remainder is network. A report without one (vLLM) is not added
    here: see :func:`split`.
    """
    base = chain_of(chain)
    if report is None or not report.has_total or any(h.kind == SERVER_KIND for h in base.hops):
        return base
    return Chain((Hop(SERVER_KIND, dict(report.entries), report.source), *base.hops))


def split(
    e2e_ms: float,
    chain: Mapping[str, float],
    report: ServerReport | None,
    client_encode_ms: float = 0.0,
    client_decode_ms: float = 0.0,
    *,
    network_estimate_ms: float | None = None,
    client_wait_ms: float = 0.0,
) -> segments.Split:
    """:func:`pathprobe.segments.split` for a path that may end in a server we did not write.

    With a report that has a total, the server is a reporting hop. With one that has parts but
    no total (vLLM's engine intervals), the server is a component that reports nothing about
    its own handling: the innermost link is unsplit (less the network estimate), and only
    the parts the server measured inside it move from unsplit to queueing and inference.
    """
    full = with_report(chain, report)
    if report is None or report.has_total or any(h.kind == SERVER_KIND for h in full.hops):
        return segments.split(
            e2e_ms,
            full,
            client_encode_ms,
            client_decode_ms,
            network_estimate_ms=network_estimate_ms,
            client_wait_ms=client_wait_ms,
        )
    silent = segments.split(
        e2e_ms,
        full,
        client_encode_ms,
        client_decode_ms,  # the whole link unsplit
        client_wait_ms=client_wait_ms,
    )
    queue = report.entries.get("srv.queue", 0.0)
    inference = report.known_ms - queue
    room = silent.unsplit - queue - inference
    if room < -1e-6:  # the report claims more than the client saw the server take: not booked
        return segments.split(
            e2e_ms,
            full,
            client_encode_ms,
            client_decode_ms,
            network_estimate_ms=network_estimate_ms,
            client_wait_ms=client_wait_ms,
        )
    # what the server measured is booked first; the network estimate fits in what is left
    est = None if network_estimate_ms is None else min(network_estimate_ms, max(room, 0.0))
    s = segments.split(
        e2e_ms, full, client_encode_ms, client_decode_ms, network_estimate_ms=est, client_wait_ms=client_wait_ms
    )
    return replace(
        s, queueing=s.queueing + queue, inference=s.inference + inference, unsplit=s.unsplit - queue - inference
    )


def decode_overlap(
    e2e_ms: float,
    chain: Mapping[str, float],
    report: ServerReport | None,
    client_encode_ms: float,
    client_decode_ms: float,
) -> float:
    """How much of a stream's client decode must have overlapped what the server measured (ms).

    A stream's events are decoded while the server still produces the next ones: that decode is
    off the request's critical path, yet the split takes it out of the link. Where a report
    without a total (vLLM's engine intervals) then claims more than the link left, at least the
    difference of the client's decode ran while the server was working: that much (no more than
    the decode itself) is not client time on the path. 0 when nothing needs it (or for a report
    with a total, or none)."""
    if report is None or report.has_total or client_decode_ms <= 0:
        return 0.0
    full = with_report(chain, report)
    if any(h.kind == SERVER_KIND for h in full.hops):
        return 0.0
    silent = segments.split(e2e_ms, full, client_encode_ms, client_decode_ms)
    deficit = report.known_ms - silent.unsplit
    return min(deficit, client_decode_ms) if deficit > 1e-6 else 0.0


def network_estimate(chain: Mapping[str, float], client_connect_ms: float | None) -> float | None:
    """The measured transport round trip of the innermost link, where there is one.

    On a direct path that is the client's own TCP connect time; behind forwarding hops, the
    innermost reporting forwarder's ``<kind>.connect`` (our gateway's ``gw.connect``). A path
    that ends in a reporting server needs none (its network is measured exactly).
    """
    hops = [h for h in chain_of(chain).hops if h.has("total")]
    if not hops:
        return client_connect_ms
    inner = hops[0]
    if inner.kind == SERVER_KIND:
        return None
    return inner.entries.get(f"{inner.kind}.connect")


def network_estimate_kind(chain: Mapping[str, float], client_kind: str | None) -> str | None:
    """What :func:`network_estimate` returns for ``chain``: the client's estimate kind on a direct
    path (:mod:`pathprobe.rtt`), the innermost forwarder's ``<kind>.connect`` behind hops."""
    hops = [h for h in chain_of(chain).hops if h.has("total")]
    if not hops:
        return client_kind
    inner = hops[0]
    key = f"{inner.kind}.connect"
    return key if inner.kind != SERVER_KIND and key in inner.entries else None
