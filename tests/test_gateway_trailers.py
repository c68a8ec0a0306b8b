"""Upstream trailers the gateway cannot read are counted and logged, never swallowed."""

from __future__ import annotations

import logging

from pathprobe.gateway.metrics import Metrics
from pathprobe.gateway.passthrough import Passthrough
from pathprobe.gateway.upstreams import Pool


class _BrokenCall:
    """A finished call whose trailing metadata cannot be read (grpcio raises on a torn-down call)."""

    def trailing_metadata(self):
        raise RuntimeError("call state gone")


def test_unreadable_trailers_are_counted_and_logged(caplog) -> None:
    pool = Pool(["127.0.0.1:1"], "grpc")
    metrics = Metrics("passthrough", pool)
    p = Passthrough(pool, metrics, tracing=False)
    with caplog.at_level(logging.WARNING, logger="pathprobe.gateway"):
        md, own = p._trailing(_BrokenCall(), 0.0, 1.5, pool.upstreams[0])
    # the caller still gets the gateway's own entries
    assert md[-1][0] == "server-timing" and own["gw.upstream"] == 1.5
    value = metrics.registry.get_sample_value(
        "pathprobe_gateway_trailer_errors_total", {"upstream": "127.0.0.1:1", "error": "RuntimeError"}
    )
    assert value == 1.0
    assert any("cannot read the trailing metadata" in r.message for r in caplog.records)
