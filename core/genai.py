"""OpenTelemetry's GenAI semantic conventions for metrics, in one place for the load generator
(``gen_ai.client.*``) and the model server (``gen_ai.server.*``): the names, units and bucket sets
that dashboards and other tools read. A gateway is not a model server: it keeps its own
``pathprobe_gateway_*`` namespace and records none of these.

Each histogram is exported two ways from the same observation:

- Prometheus (prometheus-client), named as OpenTelemetry's Prometheus exporters name them: dots
  become underscores and the unit a suffix (``gen_ai.client.operation.duration`` in ``s`` is
  ``gen_ai_client_operation_duration_seconds``; attribute keys likewise, ``gen_ai.operation.name``
  is the label ``gen_ai_operation_name``);
- OTLP (opentelemetry-sdk metrics): gRPC to ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` (else
  ``OTEL_EXPORTER_OTLP_ENDPOINT``), and/or OTLP JSON lines (one ``ExportMetricsServiceRequest`` per
  export, cumulative) to ``PATHPROBE_METRICS_FILE``.

What each figure is (its formula), so no reader has to guess:

- ``gen_ai.client.operation.duration``: request sent -> last byte of the answer (the record's
  ``e2e_ms``), every request; ``error.type`` set on a failed one.
- ``gen_ai.client.operation.time_to_first_chunk``: request sent -> first content chunk (streams).
- ``gen_ai.client.operation.time_per_output_chunk``: for each chunk after the first, the previous
  chunk's arrival -> this chunk's arrival (the record's ``itl_ms``, one observation per gap).
- ``gen_ai.client.token.usage``: input and output tokens of a successful request
  (``gen_ai.token.type``), where the count is known.
- ``gen_ai.server.request.duration``: the handler's entry -> last byte handed to the transport
  (``srv.total``), every request.
- ``gen_ai.server.time_to_first_token``: the handler's entry -> the engine handing out the first
  token; successful requests.
- ``gen_ai.server.time_per_output_token``: (request duration - time to first token) / (output tokens
  - 1); successful requests with at least two output tokens.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.semconv._incubating.metrics import gen_ai_metrics as names
from pathprobe import environment

if TYPE_CHECKING:
    from opentelemetry.metrics import Histogram as OtlpHistogram
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

#: the conventions' ExplicitBucketBoundaries (seconds; tokens for token usage)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)

#: attribute keys (OTLP) in the order of their Prometheus labels
CLIENT_ATTRS = ("gen_ai.operation.name", "gen_ai.provider.name", "server.address", "server.port", "error.type")
TOKEN_ATTRS = ("gen_ai.operation.name", "gen_ai.provider.name", "server.address", "server.port", "gen_ai.token.type")
SERVER_ATTRS = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model", "error.type")
#: our own server and native protocols, where no well-known provider value applies
PROVIDER = "pathprobe"


@dataclass(frozen=True, slots=True)
class Instrument:
    """One convention histogram: its OTel name, unit, bucket set and attribute keys."""

    name: str
    unit: str
    description: str
    buckets: tuple[float, ...]
    attrs: tuple[str, ...]

    @property
    def prometheus_name(self) -> str:
        """The name without the unit suffix (prometheus-client appends ``_seconds`` itself)."""
        return self.name.replace(".", "_")

    @property
    def prometheus_unit(self) -> str:
        return "seconds" if self.unit == "s" else ""

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(a.replace(".", "_") for a in self.attrs)


CLIENT_DURATION = Instrument(
    names.GEN_AI_CLIENT_OPERATION_DURATION, "s", "GenAI operation duration.", DURATION_BUCKETS, CLIENT_ATTRS
)
CLIENT_TTFC = Instrument(
    names.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK,
    "s",
    "Time to receive the first chunk in a streaming operation.",
    DURATION_BUCKETS,
    CLIENT_ATTRS[:-1],
)
CLIENT_TPOC = Instrument(
    names.GEN_AI_CLIENT_OPERATION_TIME_PER_OUTPUT_CHUNK,
    "s",
    "Time per output chunk, for each chunk after the first: the previous chunk's arrival to this one's.",
    DURATION_BUCKETS,
    CLIENT_ATTRS[:-1],
)
CLIENT_TOKENS = Instrument(
    names.GEN_AI_CLIENT_TOKEN_USAGE, "{token}", "Number of input and output tokens used.", TOKEN_BUCKETS, TOKEN_ATTRS
)
SERVER_DURATION = Instrument(
    names.GEN_AI_SERVER_REQUEST_DURATION,
    "s",
    "Generative AI server request duration such as time-to-last byte or last output token.",
    DURATION_BUCKETS,
    SERVER_ATTRS,
)
SERVER_TTFT = Instrument(
    names.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
    "s",
    "Time to generate first token for successful responses.",
    TTFT_BUCKETS,
    SERVER_ATTRS[:-1],
)
SERVER_TPOT = Instrument(
    names.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
    "s",
    "Time per output token generated after the first token for successful responses.",
    TPOT_BUCKETS,
    SERVER_ATTRS[:-1],
)
CLIENT_INSTRUMENTS = (CLIENT_DURATION, CLIENT_TTFC, CLIENT_TPOC, CLIENT_TOKENS)
SERVER_INSTRUMENTS = (SERVER_DURATION, SERVER_TTFT, SERVER_TPOT)


def operation_name(route: str) -> str:
    """The conventions' ``gen_ai.operation.name`` of one of our routes (``openai.chat.stream``: chat)."""
    return "chat" if ".chat" in route else "text_completion"


def provider_name(route: str) -> str:
    """``openai`` for the OpenAI-compatible routes (the API flavor the telemetry follows), else ours."""
    return "openai" if route.startswith("openai") else PROVIDER


class Recorder:
    """Observations into Prometheus histograms (in ``registry``) and, when OTLP export is on, OTLP
    histograms of the same names, units and buckets. ``attrs`` are the OTLP attribute values; the
    Prometheus labels are the same values in :attr:`Instrument.labels` order."""

    def __init__(self, instruments: Sequence[Instrument], registry: object | None, otlp: OtlpMetrics | None) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        self._prom: dict[str, Histogram] = {}
        if isinstance(registry, CollectorRegistry):
            for ins in instruments:
                self._prom[ins.name] = Histogram(
                    ins.prometheus_name,
                    ins.description,
                    list(ins.labels),
                    unit=ins.prometheus_unit,
                    buckets=ins.buckets,
                    registry=registry,
                )
        self._otlp = otlp.histograms(instruments) if otlp is not None else {}
        self._attrs = {ins.name: ins.attrs for ins in instruments}

    def observe(self, ins: Instrument, value: float, attrs: Mapping[str, str | int]) -> None:
        keys = self._attrs[ins.name]
        prom = self._prom.get(ins.name)
        if prom is not None:
            prom.labels(*(str(attrs.get(k, "")) for k in keys)).observe(value)
        otlp = self._otlp.get(ins.name)
        if otlp is not None:
            otlp.record(value, {k: attrs[k] for k in keys if k in attrs and attrs[k] != ""})


class OtlpMetrics:
    """An OTLP metrics pipeline of one process (its own MeterProvider, not the global one)."""

    def __init__(self, provider: MeterProvider, service_name: str) -> None:
        self.provider = provider
        self._meter = provider.get_meter(service_name)

    def histograms(self, instruments: Sequence[Instrument]) -> dict[str, OtlpHistogram]:
        return {
            ins.name: self._meter.create_histogram(
                ins.name, unit=ins.unit, description=ins.description, explicit_bucket_boundaries_advisory=ins.buckets
            )
            for ins in instruments
        }

    def flush(self) -> None:
        """Export what the histograms hold now (cumulative)."""
        self.provider.force_flush()

    def shutdown(self) -> None:
        """Export what was recorded (a last, final export) and stop."""
        self.provider.shutdown()


def setup_otlp(
    service_name: str, *, metrics_file: str | None = None, endpoint: str | None = None, interval_s: float = 10.0
) -> OtlpMetrics | None:
    """The process's OTLP metrics export, or None when none is asked for (arguments over environment)."""
    path = metrics_file or environment.get(environment.PATHPROBE_METRICS_FILE)
    url = (
        endpoint
        or environment.get(environment.OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)
        or environment.get(environment.OTEL_EXPORTER_OTLP_ENDPOINT)
    )
    if not path and not url:
        return None
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    exporters: list[MetricExporter] = []
    if url:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        exporters.append(OTLPMetricExporter(endpoint=url, insecure=not url.startswith("https://")))
    if path:
        exporters.append(_jsonl_exporter(path))
    readers = [PeriodicExportingMetricReader(e, export_interval_millis=interval_s * 1000) for e in exporters]
    provider = MeterProvider(metric_readers=readers, resource=Resource.create({"service.name": service_name}))
    return OtlpMetrics(provider, service_name)


def _jsonl_exporter(path: str) -> MetricExporter:
    from opentelemetry.sdk.metrics.export import MetricExporter

    class OTLPJsonLinesMetricExporter(MetricExporter):
        """Appends one OTLP JSON ``ExportMetricsServiceRequest`` per export to a file."""

        def __init__(self) -> None:
            super().__init__()
            self._lock = threading.Lock()

        def export(
            self, metrics_data: MetricsData, timeout_millis: float = 10_000, **_kw: object
        ) -> MetricExportResult:
            from google.protobuf.json_format import MessageToDict
            from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
            from opentelemetry.sdk.metrics.export import MetricExportResult

            line = json.dumps(MessageToDict(encode_metrics(metrics_data)), separators=(",", ":"))
            with self._lock, open(path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
            return MetricExportResult.SUCCESS

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 30_000, **_kw: object) -> None:
            return None

    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    return OTLPJsonLinesMetricExporter()
