"""Prometheus metrics of the load generator: the client-side split, live, per process.

Each process that runs users (a local run, or each Locust worker) serves ``/metrics`` on
``--metrics-port`` (or ``PATHPROBE_LOAD_METRICS_PORT``); Prometheus scrapes every worker
and ``histogram_quantile`` over the summed buckets gives fleet-wide percentiles. This is
the only place the per-hop network segments exist (the server and gateway cannot see the
wire they sit on), so the dashboard's segment percentiles come from here.

Records are observed in batches, off the request path: where the plugin already moves
each batch into its histograms (the local flush loop, a worker's report to the master).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from pathprobe import genai
from pathprobe.loadgen.records import SEGMENT_METRICS
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

#: ms; fine at the low end (a gateway hop is a few hundred µs), up to long generations
MS_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 150, 200, 300, 500, 1000, 2500, 5000, 10000, 30000)


class LoadMetrics:
    """``pathprobe_load_*``: requests by code, e2e/TTFT and every split segment, tokens."""

    def __init__(self, label: str = "", otlp: genai.OtlpMetrics | None = None, prometheus: bool = True) -> None:
        self.label = label
        self.registry = r = CollectorRegistry()
        #: the GenAI conventions' client histograms (gen_ai.client.*), on this registry and over OTLP
        self.genai = genai.Recorder(genai.CLIENT_INSTRUMENTS, r if prometheus else None, otlp)
        self.otlp = otlp
        self._servers: dict[str, tuple[str, int | str]] = {}
        self.requests = Counter(
            "pathprobe_load_requests", "Requests sent, by route and status code", ["label", "route", "code"], registry=r
        )
        self.segment_ms = Histogram(
            "pathprobe_load_segment_ms",
            "Client-side latency split per request (ms): e2e, ttft and each segment "
            "(network, network_hop1, network_hop2, serialization, queueing, inference, other, unsplit)",
            ["label", "route", "segment"],
            buckets=MS_BUCKETS,
            registry=r,
        )
        self.hop_ms = Histogram(
            "pathprobe_load_hop_ms",
            "Each reporting hop's own share per request (ms): part = total, serialization, other; "
            "hop = its label (gw, srv, with the hop's description)",
            ["label", "route", "hop", "part"],
            buckets=MS_BUCKETS,
            registry=r,
        )
        self.link_ms = Histogram(
            "pathprobe_load_link_ms",
            "Network per link per request (ms); link 1 = client <-> first hop, then inwards",
            ["label", "route", "link"],
            buckets=MS_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "pathprobe_load_output_tokens", "Tokens received (rate() of it is tokens/s)", ["label", "route"], registry=r
        )

    def observe(self, batch: Iterable[Mapping[str, Any]]) -> None:
        lab = self.label
        for rec in batch:
            route = rec["route"]
            self.requests.labels(lab, route, str(rec["status"])).inc()
            self._observe_genai(rec)
            if not rec["ok"]:
                continue
            seg = self.segment_ms
            split = rec.get("split") or {}
            seg.labels(lab, route, "e2e").observe(rec["e2e_ms"])
            if rec.get("ttft_ms") is not None:
                seg.labels(lab, route, "ttft").observe(rec["ttft_ms"])
            for name in SEGMENT_METRICS:
                if name in split:
                    seg.labels(lab, route, name).observe(split[name])
            for i, ms in enumerate(split.get("links") or (), 1):
                self.link_ms.labels(lab, route, str(i)).observe(ms)
            for hop in split.get("hops") or ():
                for part in ("total", "serialization", "other"):
                    self.hop_ms.labels(lab, route, hop["label"], part).observe(hop[part])
            if rec.get("tokens_out"):
                self.tokens.labels(lab, route).inc(rec["tokens_out"])

    def _server(self, target: str) -> tuple[str, int | str]:
        """``server.address`` and ``server.port`` of a record's target URL (cached per target)."""
        found = self._servers.get(target)
        if found is None:
            parts = urlsplit(target if "://" in target else f"//{target}")
            found = self._servers[target] = (parts.hostname or "", parts.port or "")
        return found

    def _observe_genai(self, rec: Mapping[str, Any]) -> None:
        """One record into the gen_ai.client.* histograms (seconds; see :mod:`pathprobe.genai`)."""
        route = rec["route"]
        address, port = self._server(rec.get("target") or "")
        attrs: dict[str, str | int] = {
            "gen_ai.operation.name": genai.operation_name(route),
            "gen_ai.provider.name": genai.provider_name(route),
            "server.address": address,
            "server.port": port,
        }
        g = self.genai
        if not rec["ok"]:
            g.observe(genai.CLIENT_DURATION, rec["e2e_ms"] / 1e3, {**attrs, "error.type": str(rec["status"])})
            return
        g.observe(genai.CLIENT_DURATION, rec["e2e_ms"] / 1e3, attrs)
        if rec.get("ttft_ms") is not None:
            g.observe(genai.CLIENT_TTFC, rec["ttft_ms"] / 1e3, attrs)
        for gap in rec.get("itl_ms") or ():
            g.observe(genai.CLIENT_TPOC, gap / 1e3, attrs)
        for kind, key in (("input", "tokens_in"), ("output", "tokens_out")):
            if rec.get(key) is not None:
                g.observe(genai.CLIENT_TOKENS, rec[key], {**attrs, "gen_ai.token.type": kind})

    def flush(self) -> None:
        """Export what the OTLP histograms hold now (cumulative: every record observed so far)."""
        if self.otlp is not None:
            self.otlp.flush()

    def close(self) -> None:
        """The OTLP pipeline's last export, then no more."""
        if self.otlp is not None:
            self.otlp.shutdown()
            self.otlp = None

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
