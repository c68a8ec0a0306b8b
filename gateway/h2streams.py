"""The frame relay's view of one gRPC call: its record, its ``gw.*`` timing entries, and the
header blocks the relay writes for it itself (trailers-only error answers).

The relay never builds a response of its own except these: a call it refuses (no upstream,
a key refused, over ``--max-inflight``) or one in flight when the upstream went away ends
with a literal-only trailer block (no HPACK table moves on either side).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from pathprobe import timing
from pathprobe.h2frames import literal_block
from pathprobe.timing import now_ms

if TYPE_CHECKING:
    from opentelemetry.trace import Span

#: grpc-status values as the metrics label them
CODE_NAMES = {
    "0": "OK",
    "1": "CANCELLED",
    "2": "UNKNOWN",
    "3": "INVALID_ARGUMENT",
    "4": "DEADLINE_EXCEEDED",
    "5": "NOT_FOUND",
    "6": "ALREADY_EXISTS",
    "7": "PERMISSION_DENIED",
    "8": "RESOURCE_EXHAUSTED",
    "9": "FAILED_PRECONDITION",
    "10": "ABORTED",
    "11": "OUT_OF_RANGE",
    "12": "UNIMPLEMENTED",
    "13": "INTERNAL",
    "14": "UNAVAILABLE",
    "15": "DATA_LOSS",
    "16": "UNAUTHENTICATED",
}


def grpc_error_block(
    code: int, message: str, own: dict[str, float], with_status: bool, extra: list[tuple[bytes, bytes]] | None = None
) -> bytes:
    """A trailer block ending a call with ``code`` (``with_status``: a trailers-only answer, the
    response headers not sent yet), the gateway's timing in ``server-timing``."""
    h = [(b":status", b"200"), (b"content-type", b"application/grpc")] if with_status else []
    h += extra or []
    h += [
        (b"grpc-status", str(code).encode()),
        (b"grpc-message", quote(message, safe=" :/()=,.;'-_").encode()),
        (timing.METADATA_KEY.encode(), timing.format_entries(own).encode()),
    ]
    return literal_block(h)


class Stream:
    """One relayed call (an HTTP/2 stream of a client connection)."""

    __slots__ = ("cspan", "ended", "method", "received", "resp_seen", "sid", "span", "t0", "t_fwd", "wait")

    def __init__(self, sid: int, t0: float) -> None:
        self.sid = sid
        self.t0 = t0  # its request headers arrived
        self.t_fwd = t0  # they were forwarded (gw.upstream starts)
        self.method = "?"
        self.resp_seen = False
        self.received = 0  # request body bytes so far
        self.span: Span | None = None  # SERVER and CLIENT spans, when tracing
        self.cspan: Span | None = None
        self.ended = False  # trailers relayed, bookkeeping pending
        self.wait: float | None = None  # its wait for the relay's loop before t0 (gw.wait; None: not measured)

    def own(self, t_in: float | None = None) -> dict[str, float]:
        """The gateway's entries now (``t_in``: when the upstream's answer came in)."""
        t = now_ms()
        out = {"gw.decode": 0.0, "gw.upstream": (t_in or t) - self.t_fwd, "gw.encode": 0.0}
        if self.wait is not None:
            out["gw.wait"] = self.wait
        out["gw.total"] = t - self.t0
        return out


#: the entries of a call refused before it reached anything
NO_TIME = {"gw.decode": 0.0, "gw.upstream": 0.0, "gw.encode": 0.0, "gw.total": 0.0}
