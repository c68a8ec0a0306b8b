"""The frame relay's settings: one frozen value, built once from the gateway's configuration.

:mod:`~pathprobe.gateway.h2proxy` builds it and hands it to every client connection
(:mod:`~pathprobe.gateway.h2conn`) and to the header-block rewriting
(:mod:`~pathprobe.gateway.h2headers`); neither reads anything back off the proxy.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pathprobe import telemetry
from pathprobe.auth import ApiKeys
from pathprobe.gateway.config import GatewayConfig
from pathprobe.gateway.metrics import Metrics
from pathprobe.gateway.upstreams import Pool

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """What every client connection of the relay shares (the pool and metrics are live objects;
    the rest does not change after start-up)."""

    pool: Pool
    metrics: Metrics | None
    tracing: bool
    #: the largest request body relayed (bytes)
    max_body: int
    #: header blocks decoded (after forwarding) for the metrics label and the call's status
    decode: bool
    #: request header blocks decoded and re-encoded (as literals: no HPACK table moves) before forwarding
    rewrite: bool
    auth: ApiKeys
    #: the credential sent upstream instead of the client's
    upstream_authorization: bytes | None
    #: TLS to the upstreams (ALPN h2), and the name their certificates must carry
    upstream_ssl: ssl.SSLContext | None
    upstream_server_name: str | None
    tracer: Tracer | None

    @classmethod
    def build(cls, cfg: GatewayConfig, pool: Pool, metrics: Metrics | None, tracing: bool) -> RelaySettings:
        auth = cfg.auth
        authorization = cfg.upstream_authorization.encode() if cfg.upstream_authorization else None
        tls = cfg.upstream_tls_files
        rewrite = tracing or bool(auth) or authorization is not None or bool(pool.max_inflight)
        return cls(
            pool=pool,
            metrics=metrics,
            tracing=tracing,
            max_body=cfg.max_body_bytes,
            decode=cfg.decode_metadata or rewrite,
            rewrite=rewrite,
            auth=auth,
            upstream_authorization=authorization,
            upstream_ssl=tls.client_context(alpn=("h2",)) if tls is not None else None,
            upstream_server_name=tls.server_name if tls is not None else None,
            tracer=telemetry.get_tracer("pathprobe.gateway") if tracing else None,
        )
