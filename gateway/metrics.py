"""Prometheus metrics of the gateway, served on ``--admin-port`` at ``/metrics``."""

from __future__ import annotations

from functools import partial

from pathprobe.gateway.upstreams import Pool, Upstream
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def _healthy(u: Upstream) -> float:
    return 1.0 if u.healthy else 0.0


def _outstanding(u: Upstream) -> float:
    return float(u.outstanding)


class Metrics:
    def __init__(self, mode: str, pool: Pool) -> None:
        self.mode = mode
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "pathprobe_gateway_requests",
            "Calls handled, by method/route and result code.",
            ["mode", "method", "code"],
            registry=r,
        )
        self.duration = Histogram(
            "pathprobe_gateway_request_duration_seconds",
            "Gateway handler entry to last byte handed to the transport (gw.total).",
            ["mode", "method"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.upstream_duration = Histogram(
            "pathprobe_gateway_upstream_duration_seconds",
            "The upstream call as the gateway saw it (gw.upstream).",
            ["mode", "upstream"],
            buckets=_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "pathprobe_gateway_upstream_errors", "Failed upstream calls by code.", ["upstream", "code"], registry=r
        )
        self.trailer_errors = Counter(
            "pathprobe_gateway_trailer_errors",
            "Upstream trailers (gRPC trailing metadata, HTTP/2 trailer blocks) the gateway "
            "could not read or decode, by upstream and error.",
            ["upstream", "error"],
            registry=r,
        )
        healthy = Gauge(
            "pathprobe_gateway_upstream_healthy", "1 while the upstream passes health checks.", ["upstream"], registry=r
        )
        outstanding = Gauge(
            "pathprobe_gateway_upstream_outstanding", "Calls in flight on the upstream.", ["upstream"], registry=r
        )
        for u in pool.upstreams:
            healthy.labels(u.target).set_function(partial(_healthy, u))
            outstanding.labels(u.target).set_function(partial(_outstanding, u))
        #: (method, code, upstream) -> its request counter, duration and upstream-duration histograms
        self._children: dict[tuple[str, str, str | None], tuple[Counter, Histogram, Histogram | None]] = {}

    def observe(self, method: str, code: str, total_ms: float, upstream: str | None, upstream_ms: float) -> None:
        key = (method, code, upstream)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = (
                self.requests.labels(self.mode, method, code),
                self.duration.labels(self.mode, method),
                self.upstream_duration.labels(self.mode, upstream) if upstream else None,
            )
        c[0].inc()
        c[1].observe(total_ms / 1000.0)
        if c[2] is not None and upstream_ms > 0:
            c[2].observe(upstream_ms / 1000.0)

    def trailer_error(self, upstream: str, error: str) -> None:
        self.trailer_errors.labels(upstream, error).inc()

    def upstream_error(self, upstream: str, code: str) -> None:
        self.upstream_errors.labels(upstream, code).inc()

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
