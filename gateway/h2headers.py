"""What the frame relay reads in header blocks (HPACK), and the request blocks it rewrites.

Requests: by default only ``:path`` is read, after the block was forwarded (the metrics label).
With an API key to check, a credential to replace, ``--max-inflight`` or tracing, the block is
decoded before forwarding and re-encoded as literals (no HPACK table moves on either side).
Responses: read after they were forwarded, for the call's ``grpc-status`` and, when tracing,
the upstream's ``server-timing``. A block that cannot be decoded leaves the status unknown:
counted and logged, not guessed.
"""

from __future__ import annotations

import logging

from hpack.exceptions import HPACKError
from pathprobe.gateway import h2spans
from pathprobe.gateway.h2settings import RelaySettings
from pathprobe.gateway.h2streams import Stream
from pathprobe.gateway.metrics import Metrics
from pathprobe.gateway.upstreams import Upstream
from pathprobe.h2frames import NOTHING, STATUS, BlockReader, literal_block

log = logging.getLogger("pathprobe.gateway")

_CREDENTIALS = (b"authorization", b"x-api-key")


def label(st: Stream, headers: list[tuple[bytes, bytes]]) -> None:
    """The call's metrics label: its ``:path``."""
    for k, v in headers:
        if k == b":path":
            st.method = v.decode(errors="replace")
            break


def request_block(
    settings: RelaySettings, st: Stream | None, headers: list[tuple[bytes, bytes]], upstream: Upstream | None
) -> bytes:
    """The request header block to forward: the caller's key checked, the credential replaced,
    the CLIENT span's ``traceparent``. Raises :class:`~pathprobe.errors.PathprobeError` when
    the call is refused (the key, or the upstream at ``--max-inflight``)."""
    if st is not None:
        label(st, headers)
        if settings.auth:
            settings.auth.check_mapping({k.decode(errors="replace"): v.decode(errors="replace") for k, v in headers})
        if upstream is not None and settings.pool.over_cap(upstream):
            raise settings.pool.full()
    if settings.upstream_authorization is not None:
        headers = [(k, v) for k, v in headers if k not in _CREDENTIALS]
        headers.append((b"authorization", settings.upstream_authorization))
    if settings.tracer is not None and st is not None:
        headers = h2spans.start(settings.tracer, st, headers, upstream.target if upstream else None)
    return literal_block(headers)


class ResponseReader:
    """The upstream's response header blocks of one connection (its HPACK table), read after
    they were forwarded."""

    def __init__(self, metrics: Metrics | None, tracing: bool) -> None:
        self.dec = BlockReader()
        self.metrics = metrics
        self.tracing = tracing

    def read(self, blocks: list[tuple[int, bytes, bool]], target: str) -> tuple[dict[int, str], dict[int, str] | None]:
        """``blocks``: (stream id, block, is trailers) in arrival order (every block must be read to
        keep the table in step). Returns each stream's grpc-status and, when tracing, the
        upstream's ``server-timing``."""
        codes: dict[int, str] = {}
        sts: dict[int, str] | None = {} if self.tracing else None
        for sid, block, trailers in blocks:
            try:
                if sts is not None and trailers:  # tracing: the upstream's server-timing too
                    headers = self.dec.decode_all(block)
                    sts[sid] = ", ".join(v.decode() for k, v in headers if k == b"server-timing")
                    fields = dict(headers)
                else:  # keeps the table in step; response headers need nothing else
                    fields = self.dec.read(block, STATUS if trailers else NOTHING)
            except HPACKError as exc:  # the status stays unknown: counted and logged, not guessed
                log.warning(
                    "upstream %s: cannot decode a %s block of stream %d: %s",
                    target,
                    "trailer" if trailers else "header",
                    sid,
                    exc,
                )
                if self.metrics is not None:
                    self.metrics.trailer_error(target, type(exc).__name__)
                continue
            if trailers and b"grpc-status" in fields:
                codes[sid] = fields[b"grpc-status"].decode()
        return codes, sts
