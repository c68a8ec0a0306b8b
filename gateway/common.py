"""Pieces every gateway mode shares: addresses, error bodies, metadata filtering."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from pathprobe import address, grpcwait, jsoncodec
from pathprobe.errors import GRPC_TO_HTTP, ConfigError, error_json

MODES = ("passthrough", "transcode", "reencode", "http-proxy")
BALANCE = ("round-robin", "least-outstanding")

#: gRPC metadata keys the gateway never copies onto the upstream call (grpc sets them itself).
_DROP_METADATA = frozenset(
    {"user-agent", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "te", "content-type", "host"}
    | {grpcwait.METADATA_KEY}  # the caller's deadline is not the re-issued call's: each caller declares its own
)
#: HTTP hop-by-hop headers (RFC 9110 7.6.1) plus the ones aiohttp recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "proxy-authenticate",
        "proxy-authorization",
    }
)


def parse_hostport(value: str, flag: str) -> tuple[str, int]:
    host, port = address.parse_hostport(value, flag)
    if port == 0 and flag != "--listen":
        raise ConfigError(f"{flag}: port 0 is not an address to connect to ({value!r})")
    return host, port


def parse_upstreams(value: str, flag: str = "--upstream") -> list[str]:
    out = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        host, port = parse_hostport(item, flag)
        out.append(f"{host}:{port}")
    if not out:
        raise ConfigError(f"{flag}: at least one HOST:PORT is needed")
    return out


def forward_metadata(invocation: Iterable[tuple[str, str | bytes]] | None) -> list[tuple[str, str | bytes]]:
    """Incoming gRPC metadata that goes on to the upstream unchanged."""
    return [(k, v) for k, v in (invocation or ()) if k[0] != ":" and k not in _DROP_METADATA]


_CREDENTIALS = ("authorization", "x-api-key")
#: a header's value: ``str`` (HTTP headers), ``str | bytes`` (gRPC metadata, binary keys included)
V = TypeVar("V", str, str | bytes)


def upstream_credentials(items: list[tuple[str, V]], replacement: str | None) -> list[tuple[str, V]]:
    """Metadata/headers for the upstream: the client's credential, or ``replacement`` in its place."""
    if replacement is None:
        return items
    return [(k, v) for k, v in items if k.lower() not in _CREDENTIALS] + [("authorization", replacement)]


def client_credentials(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The credential headers a client sent (to forward upstream unchanged)."""
    out = []
    for k in _CREDENTIALS:
        v = headers.get(k)
        if v:
            out.append((k, v))
    return out


def grpc_timeout(time_remaining: float | None) -> float | None:
    """The sync server reports 'no deadline' as ~9.2e18 s; the channel wants None."""
    if time_remaining is None or time_remaining > 1e8:
        return None
    return time_remaining


def http_status_of(code: grpc.StatusCode) -> int:
    return GRPC_TO_HTTP.get(code, 500)


def error_event(
    code: grpc.StatusCode, message: str, status: int | None = None, server_timing: str | None = None
) -> bytes:
    """An error inside an SSE stream that has already started (the same shape as error bodies)."""
    obj = error_json(status or http_status_of(code), code, message)
    if server_timing:
        obj["server_timing"] = server_timing
    return b"data: " + jsoncodec.dumps(obj) + b"\n\n"


__all__ = ["error_json"]


def dumps(obj: object) -> bytes:
    return jsoncodec.dumps(obj)


@dataclass
class Entries:
    """The gateway's own ``gw.*`` durations for one call (ms)."""

    decode: float = 0.0
    encode: float = 0.0
    upstream: float = 0.0
    total: float = 0.0
    #: TCP connect time of the upstream connection (a round trip; None when not measured)
    connect: float | None = None
    #: a stream's waits on the downstream transport to take each chunk (``gw.send``: the client
    #: link's stack time, :data:`pathprobe.timing.SEND_PART`); None when not measured
    send: float | None = None
    #: a stream's time the gateway spent behind its upstream (``gw.backlog``, its own: in its "other"):
    #: :meth:`pathprobe.gateway.streamwork.StreamWork.held`; None when not measured
    backlog: float | None = None
    #: the request's wait for the gateway's loop before ``t0`` (``gw.wait``, its queueing:
    #: :mod:`pathprobe.loopwait`); None when not measured
    wait: float | None = None
    #: inside ``upstream``: the upstream's answer's wait for the gateway's loop before it was read
    #: (``gw.upwait``, its queueing: :func:`pathprobe.loopwait.read_wait_ms` / ``grpc_wait_ms``); None
    #: when not measured
    upwait: float | None = None
    extra: dict[str, float] = field(default_factory=dict)
    #: the Server-Timing string sent downstream (upstream's entries + these), once sent
    sent: str | None = None

    def as_dict(self) -> dict[str, float]:
        out = {"gw.decode": self.decode, "gw.encode": self.encode, "gw.upstream": self.upstream}
        if self.connect is not None:
            out["gw.connect"] = self.connect
        if self.send is not None:
            out["gw.send"] = self.send
        if self.backlog is not None:
            out["gw.backlog"] = self.backlog
        if self.wait is not None:
            out["gw.wait"] = self.wait
        if self.upwait is not None:
            out["gw.upwait"] = self.upwait
        out["gw.total"] = self.total
        return out
