"""Prometheus metrics of the model server (served at ``GET /metrics``)."""

from __future__ import annotations

from collections.abc import Mapping

from pathprobe import genai
from pathprobe.gputelemetry import GpuSampler
from pathprobe.server.engine.base import Engine
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_MS_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self, engine: Engine, otlp: genai.OtlpMetrics | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        #: the GenAI conventions' server histograms (gen_ai.server.*), on /metrics and over OTLP
        self.genai = genai.Recorder(genai.SERVER_INSTRUMENTS, r, otlp)
        self.model = engine.model_name
        self.requests = Counter(
            "pathprobe_server_requests", "Requests handled, by route and status code", ["route", "code"], registry=r
        )
        self.segment_ms = Histogram(
            "pathprobe_server_segment_ms",
            "Server-side duration per Server-Timing entry (ms)",
            ["route", "entry"],
            buckets=_MS_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "pathprobe_server_generated_tokens", "Tokens generated (rate() of it is tokens/s)", registry=r
        )
        self.prompt_tokens = Counter("pathprobe_server_prompt_tokens", "Prompt tokens processed", registry=r)
        self.batch_size = Histogram(
            "pathprobe_server_batch_size",
            "Largest batch each request ran in",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        queue = Gauge("pathprobe_server_queue_depth", "Requests waiting for an engine slot", registry=r)
        queue.set_function(engine.queue_depth)
        running = Gauge("pathprobe_server_running", "Requests running in the engine", registry=r)
        running.set_function(engine.running)
        self.startup = Gauge(
            "pathprobe_server_startup_seconds",
            "Startup breakdown: seconds per phase (tracing, engine_create, engine_start, listeners)",
            ["phase"],
            registry=r,
        )
        self.startup_ms = Gauge(
            "pathprobe_server_startup_ms",
            "Startup attribution: ms per phase (imports, tokenizer, weights, warm-up, graphs, ...; "
            "first_request once it ran)",
            ["phase"],
            registry=r,
        )

    def set_startup(self, phases: Mapping[str, float]) -> None:
        for phase, seconds in phases.items():
            self.startup.labels(phase).set(seconds)

    def set_startup_phases(self, phases: Mapping[str, float]) -> None:
        for phase, ms in phases.items():
            self.startup_ms.labels(phase).set(ms)

    def watch_gpu(self, sampler: GpuSampler) -> None:
        """GPU gauges read from the sampler's latest reading (absent without a GPU)."""
        if not sampler.available:
            return
        r = self.registry

        def reader(attr: str):
            return lambda: float(getattr(sampler.latest(), attr, float("nan")))

        for attr, help_ in (
            ("temperature_c", "GPU temperature (C)"),
            ("sm_clock_mhz", "GPU SM clock (MHz)"),
            ("power_w", "GPU power draw (W)"),
            ("memory_used_mib", "GPU memory used (MiB)"),
            ("reasons", "NVML clock-event (throttle) reason bits of the latest sample"),
        ):
            g = Gauge(f"pathprobe_gpu_{attr if attr != 'reasons' else 'throttle_reasons'}", help_, registry=r)
            g.set_function(reader(attr))

    def observe(self, route: str, code: str, entries: Mapping[str, float]) -> None:
        self.requests.labels(route, code).inc()
        for name, ms in entries.items():
            self.segment_ms.labels(route, name).observe(ms)

    def observe_generation(self, prompt_tokens: int, completion_tokens: int, batch_size: int) -> None:
        self.tokens.inc(completion_tokens)
        self.prompt_tokens.inc(prompt_tokens)
        if batch_size:
            self.batch_size.observe(batch_size)

    def observe_genai(self, route: str, code: str, total_ms: float, first_token_ms: float | None, tokens: int) -> None:
        """One request into the gen_ai.server.* histograms (seconds; formulas in :mod:`pathprobe.genai`):
        its duration always; time to first token and time per output token when it succeeded and
        the engine handed out a first token (``first_token_ms``: since the handler's entry)."""
        attrs: dict[str, str | int] = {
            "gen_ai.operation.name": genai.operation_name(route),
            "gen_ai.provider.name": genai.provider_name(route),
            "gen_ai.request.model": self.model,
        }
        ok = code in ("OK", "200")
        self.genai.observe(genai.SERVER_DURATION, total_ms / 1e3, attrs if ok else {**attrs, "error.type": code})
        if not ok or first_token_ms is None:
            return
        self.genai.observe(genai.SERVER_TTFT, first_token_ms / 1e3, attrs)
        if tokens > 1:
            self.genai.observe(genai.SERVER_TPOT, (total_ms - first_token_ms) / (tokens - 1) / 1e3, attrs)

    def render(self) -> bytes:
        return generate_latest(self.registry)
