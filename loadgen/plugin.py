"""pathprobe's Locust plugin: command-line flags, per-run state, distribution, outputs.

Imported by :mod:`pathprobe.loadgen.users`. Everything goes through Locust's extension
points: ``init_command_line_parser``, ``init``, ``test_start``/``test_stop``,
``report_to_master``/``worker_report`` and custom messages for distributed runs, the
web UI's Flask app for the live view.

Distributed runs: each worker ships, with each of Locust's stats reports, the records of
the last interval plus their HDR histograms (encoded); the master merges the histograms
(exactly) and writes the records. When the test stops each worker sends a final batch
(``pathprobe_final``) with its own totals, and the master waits for every worker's
final batch before it writes its files.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
import weakref
from dataclasses import dataclass
from typing import Any

import gevent
from locust import events
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner
from pathprobe import environment as env_vars
from pathprobe.errors import ConfigError
from pathprobe.loadgen import clientwait, hist
from pathprobe.loadgen import metrics as metrics_mod
from pathprobe.loadgen import monitor as monitor_mod
from pathprobe.loadgen import prompts as prompts_mod
from pathprobe.loadgen.arrival import Schedule
from pathprobe.loadgen.records import METRICS, Aggregator, JsonlWriter, format_table, write_outputs
from pathprobe.tls import TlsFiles

log = logging.getLogger("pathprobe.loadgen")

MSG_FINAL = "pathprobe_final"
MSG_SHARE = "pathprobe_share"
MSG_STOP = "pathprobe_stop"
LOCAL_FLUSH_S = 0.25
#: records per slice of a periodic flush; the event loop runs between slices, so a flush never
#: holds the loop (and every user's next request) for more than a few ms (one 1 s flush of
#: ~4k records held it ~100 ms and cut a 16-user run's req/s by half)
FLUSH_SLICE = 128


# --- flags ---------------------------------------------------------------------------------
@events.init_command_line_parser.add_listener
def add_arguments(parser: Any) -> None:
    g = parser  # Locust's parser (supports include_in_web_ui); groups would not
    g.add_argument(
        "--out",
        default="pathprobe-load",
        include_in_web_ui=False,
        help="folder for records.jsonl, summary.json/.csv, histograms.json",
    )
    g.add_argument("--stream", action="store_true", default=False, help="use the streaming route")
    g.add_argument(
        "--openai-api",
        choices=["completions", "chat"],
        default="completions",
        help="OpenAI-compatible route for openai+http:// targets",
    )
    g.add_argument("--model", default="", help="model name sent (OpenAI default: first of GET /v1/models)")
    g.add_argument("--max-tokens", type=int, default=16, help="max_tokens per request")
    g.add_argument(
        "--no-ignore-eos",
        action="store_true",
        default=False,
        help="let the model stop at EOS (default: ignore_eos, exactly max_tokens)",
    )
    g.add_argument(
        "--prompt-set",
        choices=["fixed", "sweep", "mixed", "file"],
        default="fixed",
        help="fixed: one prompt of --prompt-tokens; sweep: --prompt-lengths round-robin; "
        "mixed: --prompt-lengths at random; file: --prompt-file JSONL",
    )
    g.add_argument("--prompt", default=prompts_mod.DEFAULT_PROMPT, help="base text of generated prompts")
    g.add_argument("--prompt-tokens", type=int, default=64, help="exact prompt length in tokens (fixed set)")
    g.add_argument(
        "--prompt-lengths",
        default=",".join(map(str, prompts_mod.DEFAULT_LENGTHS)),
        help="token lengths for the sweep/mixed sets, e.g. 16,64,256",
    )
    g.add_argument(
        "--prompt-file",
        default="",
        include_in_web_ui=False,
        help='JSONL prompts: {"prompt": "...", "max_tokens": optional} per line',
    )
    g.add_argument(
        "--tokenizer", default="tiny", help="tokenizer for exact prompt lengths: tiny | preset:NAME | PATH | none"
    )
    g.add_argument(
        "--arrival",
        choices=["closed", "constant", "poisson"],
        default="closed",
        help="closed loop (users back to back) or open loop at --rate",
    )
    g.add_argument("--rate", type=float, default=0.0, help="open loop: total requests/s")
    g.add_argument("--ramp", type=float, default=0.0, help="open loop: seconds to ramp from 0 to --rate")
    g.add_argument(
        "--sweep",
        default="",
        include_in_web_ui=False,
        help="concurrency sweep, e.g. 1,4,16,64 (pathprobe load only): one run per value",
    )
    g.add_argument("--timeout-s", type=float, default=60.0, help="per-request deadline (s)")
    g.add_argument(
        "--grpc-client",
        choices=["h2", "grpcio"],
        default="h2",
        help="gRPC transport: h2 = pathprobe's HTTP/2 client (a fraction of grpcio's CPU per call "
        "under gevent, same records); grpcio = grpcio's channel",
    )
    g.add_argument(
        "--api-key",
        default="",
        include_in_web_ui=False,
        help=f"sent as 'Authorization: Bearer KEY' (default: ${ENV_API_KEY})",
    )
    g.add_argument(
        "--target-ca",
        default="",
        include_in_web_ui=False,
        help=f"grpcs:// / https://: CA that signs the target's certificate (default: system CAs; ${ENV_TLS}_CA)",
    )
    g.add_argument(
        "--target-cert",
        default="",
        include_in_web_ui=False,
        help=f"client certificate for targets that want mTLS (${ENV_TLS}_CERT)",
    )
    g.add_argument("--target-key", default="", include_in_web_ui=False, help=f"its private key (${ENV_TLS}_KEY)")
    g.add_argument(
        "--target-server-name",
        default="",
        include_in_web_ui=False,
        help=f"name expected in the target's certificate (default: the host; ${ENV_TLS}_SERVER_NAME)",
    )
    g.add_argument(
        "--traces-file",
        default="",
        include_in_web_ui=False,
        help="write CLIENT spans to this OTLP JSON lines file (OTLP export: OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    g.add_argument(
        "--no-records",
        action="store_true",
        default=False,
        include_in_web_ui=False,
        help="do not write records.jsonl (summaries stay exact)",
    )
    g.add_argument("--label", default="", include_in_web_ui=False, help="copied into summary.json meta.label")
    g.add_argument("--seed", type=int, default=0, include_in_web_ui=False, help="seed for Poisson/mixed prompts")
    g.add_argument(
        "--client-lag-threshold-ms",
        type=float,
        default=monitor_mod.DEFAULT_LAG_THRESHOLD_MS,
        include_in_web_ui=False,
        help="the load generator counts as saturated when its event-loop lag p99 reaches this "
        "(or its loop CPU mean reaches 90%% of a core); see summary.json 'client'",
    )
    g.add_argument(
        "--mix",
        default="",
        include_in_web_ui=False,
        help="call-by-call interleaving: NAME=URL[,NAME=URL...]; each user sends each call to the "
        "next configuration of a freshly shuffled order (records carry 'config' and 'cycle'; "
        "-H is then only Locust's label)",
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        include_in_web_ui=False,
        help="serve Prometheus /metrics (the client-side split, live) on this port from each "
        "process that runs users (default: $PATHPROBE_LOAD_METRICS_PORT, else off)",
    )
    g.add_argument(
        "--metrics-host",
        default="",
        include_in_web_ui=False,
        help="address for --metrics-port (default: $PATHPROBE_LOAD_METRICS_HOST, else 127.0.0.1)",
    )
    g.add_argument(
        "--pathprobe-busy-ms",
        type=float,
        default=0.0,
        include_in_web_ui=False,
        help="TEST HOOK: each user burns this many ms of CPU before each request (outside "
        "the timed part), to make the load generator saturate on purpose",
    )


#: environment fallbacks of --api-key and --tls-* (the flag wins)
ENV_API_KEY = env_vars.PATHPROBE_API_KEY
ENV_TLS = env_vars.PATHPROBE_LOAD_TLS


@dataclass
class Config:
    out: str = "pathprobe-load"
    stream: bool = False
    openai_api: str = "completions"
    model: str = ""
    max_tokens: int = 16
    ignore_eos: bool = True
    prompt_set: str = "fixed"
    prompt: str = prompts_mod.DEFAULT_PROMPT
    prompt_tokens: int = 64
    prompt_lengths: tuple[int, ...] = prompts_mod.DEFAULT_LENGTHS
    prompt_file: str = ""
    tokenizer: str = "tiny"
    arrival: str = "closed"
    rate: float = 0.0
    ramp: float = 0.0
    timeout_s: float = 60.0
    grpc_client: str = "h2"
    traces_file: str = ""
    records: bool = True
    label: str = ""
    seed: int = 0
    lag_threshold_ms: float = monitor_mod.DEFAULT_LAG_THRESHOLD_MS
    busy_ms: float = 0.0
    #: call-by-call interleaving: (name, url) per configuration; empty: every call goes to --host
    mix: tuple[tuple[str, str], ...] = ()
    api_key: str = ""
    tls: TlsFiles | None = None  # client TLS files for grpcs:// / https:// (None: system CAs)

    @classmethod
    def from_options(cls, o: Any) -> Config:
        g = lambda name, default: getattr(o, name, default) if o is not None else default  # noqa: E731
        cfg = cls(
            out=g("out", "pathprobe-load") or "pathprobe-load",
            stream=bool(g("stream", False)),
            openai_api=g("openai_api", "completions"),
            model=g("model", "") or "",
            max_tokens=int(g("max_tokens", 16)),
            ignore_eos=not g("no_ignore_eos", False),
            prompt_set=g("prompt_set", "fixed"),
            prompt=g("prompt", prompts_mod.DEFAULT_PROMPT),
            prompt_tokens=int(g("prompt_tokens", 64)),
            prompt_lengths=tuple(
                prompts_mod.parse_int_list(str(g("prompt_lengths", "16,64,256,1024")), "prompt-lengths")
            ),
            prompt_file=g("prompt_file", "") or "",
            tokenizer=g("tokenizer", "tiny") or "none",
            arrival=g("arrival", "closed"),
            rate=float(g("rate", 0.0) or 0.0),
            ramp=float(g("ramp", 0.0) or 0.0),
            timeout_s=float(g("timeout_s", 60.0)),
            grpc_client=g("grpc_client", "h2") or "h2",
            traces_file=g("traces_file", "") or "",
            records=not g("no_records", False),
            label=g("label", "") or "",
            seed=int(g("seed", 0) or 0),
            lag_threshold_ms=float(g("client_lag_threshold_ms", monitor_mod.DEFAULT_LAG_THRESHOLD_MS)),
            busy_ms=float(g("pathprobe_busy_ms", 0.0) or 0.0),
            mix=parse_mix(g("mix", "") or ""),
            api_key=g("api_key", "") or os.environ.get(ENV_API_KEY, ""),
            tls=_tls_files(g),
        )
        if cfg.max_tokens <= 0:
            raise ConfigError(f"max-tokens: must be > 0, got {cfg.max_tokens}")
        if cfg.arrival != "closed" and cfg.rate <= 0:
            raise ConfigError(f"rate: --arrival {cfg.arrival} needs --rate R > 0 (requests/s)")
        if cfg.timeout_s <= 0:
            raise ConfigError("timeout-s: must be > 0")
        if cfg.lag_threshold_ms <= 0:
            raise ConfigError("client-lag-threshold-ms: must be > 0")
        if cfg.busy_ms < 0:
            raise ConfigError("pathprobe-busy-ms: must be >= 0")
        return cfg


def parse_mix(text: str) -> tuple[tuple[str, str], ...]:
    """``a=grpc://h:p,b=http://h:q`` -> ``(("a", "grpc://h:p"), ("b", "http://h:q"))``."""
    out: list[tuple[str, str]] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, sep, url = item.partition("=")
        if not sep or not name.strip() or not url.strip():
            raise ConfigError(f"mix: expected NAME=URL, got {item!r}")
        if name.strip() in {n for n, _ in out}:
            raise ConfigError(f"mix: configuration name {name.strip()!r} appears twice")
        out.append((name.strip(), url.strip()))
    return tuple(out)


def _tls_files(g: Any) -> TlsFiles | None:
    tls = TlsFiles.from_env(
        ENV_TLS, {k: g(f"target_{k}", "") for k in ("ca", "cert", "key", "server_name")}, flag="--target"
    )
    return tls if (tls.ca or tls.cert or tls.server_name) else None


# --- tracing -------------------------------------------------------------------------------
class Tracing:
    """A CLIENT span per request; ``traceparent`` injected into metadata/headers."""

    def __init__(self, tracer: Any, provider: Any, deferred: list[Any] | None = None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from pathprobe import telemetry

        self.tracer = tracer
        self.provider = provider
        self.deferred = list(deferred or ())
        self._trace = trace
        self._kind = SpanKind.CLIENT
        self._status = Status
        self._code = StatusCode
        self._inject = telemetry.inject
        self._wall = telemetry.mono_ms_to_wall_ns

    @classmethod
    def create(cls, cfg: Config, options: Any) -> Tracing | None:
        from opentelemetry import trace
        from pathprobe import telemetry

        locust_otel = bool(getattr(options, "otel", False))
        if locust_otel and hasattr(trace.get_tracer_provider(), "add_span_processor"):
            # Locust's --otel owns the global provider (and its OTLP exporter): use it.
            provider = trace.get_tracer_provider()
            if cfg.traces_file and hasattr(provider, "add_span_processor"):
                mine = telemetry.DeferredSpanProcessor(telemetry.OTLPJsonLinesExporter(cfg.traces_file))
                provider.add_span_processor(mine)
                return cls(provider.get_tracer("pathprobe.loadgen"), None, [mine])
            return cls(provider.get_tracer("pathprobe.loadgen"), None)
        # spans are exported between requests (Runtime.flush), not by a thread that competes for the
        # interpreter lock while a response waits to be timed
        provider = telemetry.setup_tracing(
            "pathprobe-loadgen", traces_file=cfg.traces_file or None, set_global=False, deferred=True
        )
        if provider is None:
            return None
        return cls(provider.get_tracer("pathprobe.loadgen"), provider, telemetry.deferred_processors(provider))

    def drain(self) -> None:
        """Export the spans finished since the last call (in this thread, between requests)."""
        for p in self.deferred:
            p.drain()

    def start(self, route: str, target: Any, spec: Any, headers: dict[str, str]) -> tuple[Any, int]:
        """Start the CLIENT span; returns it and its start (perf_counter_ns), which becomes the
        request's t0, so span duration == e2e exactly (traceparent injection counts as client encode)."""
        attrs: dict[str, Any] = {
            "pathprobe.route": route,
            "gen_ai.request.max_tokens": spec.max_tokens,
            "pathprobe.request_id": spec.request_id,
        }
        if target.kind == "grpc":
            method = "GenerateStream" if spec.stream else "Generate"
            host, _, port = target.address.rpartition(":")
            attrs.update(
                {
                    "rpc.system": "grpc",
                    "rpc.service": "pathprobe.v1.LLM",
                    "rpc.method": method,
                    "server.address": host,
                    "server.port": int(port) if port.isdigit() else 0,
                }
            )
        else:
            attrs.update({"http.request.method": "POST", "url.full": target.address})
        # placed on the same monotonic clock as the record, so span duration == e2e
        t0 = time.perf_counter_ns()
        span = self.tracer.start_span(route, kind=self._kind, attributes=attrs, start_time=self._wall(t0 / 1e6))
        self._inject(headers, self._trace.set_span_in_context(span))
        return span, t0

    def end(self, span: Any, rec: dict[str, Any], t_end_ns: int = 0) -> None:
        ctx = span.get_span_context()
        if ctx.is_valid and ctx.trace_flags.sampled:  # only ids of traces that are exported
            rec["trace_id"] = f"{ctx.trace_id:032x}"
        if rec["tokens_out"] is not None:
            span.set_attribute("gen_ai.usage.output_tokens", rec["tokens_out"])
        if rec["tokens_in"] is not None:
            span.set_attribute("gen_ai.usage.input_tokens", rec["tokens_in"])
        span.set_attribute("pathprobe.status", rec["status"])
        if rec["status"].isdigit():
            span.set_attribute("http.response.status_code", int(rec["status"]))
        elif rec["route"].startswith("grpc."):
            span.set_attribute("rpc.grpc.status_code", rec["status"])
        # the client's own durations (what trace-based analysis needs from this hop)
        span.set_attribute("pathprobe.client.encode_ms", round(rec["client_encode_ms"], 4))
        span.set_attribute("pathprobe.client.decode_ms", round(rec["client_decode_ms"], 4))
        span.set_attribute("pathprobe.e2e_ms", round(rec["e2e_ms"], 4))
        if rec.get("client_wait_ms"):
            span.set_attribute("pathprobe.client.wait_ms", round(rec["client_wait_ms"], 4))
        if rec["schedule_lag_ms"]:
            span.set_attribute("pathprobe.schedule_lag_ms", round(rec["schedule_lag_ms"], 4))
        if rec["split"]:
            for k, v in rec["split"].items():
                if isinstance(v, float):  # the segments; per-link and per-hop lists stay in the record
                    span.set_attribute(f"pathprobe.split.{k}_ms", round(v, 4))
        if rec.get("network_estimate_ms") is not None:
            span.set_attribute("pathprobe.network_estimate_ms", round(rec["network_estimate_ms"], 4))
        if rec.get("network_estimate_kind"):
            span.set_attribute("pathprobe.network_estimate_kind", rec["network_estimate_kind"])
        if rec["ttft_ms"] is not None:
            span.set_attribute("pathprobe.ttft_ms", round(rec["ttft_ms"], 4))
        if not rec["ok"]:
            span.set_status(self._status(self._code.ERROR, f"{rec['status']}: {rec['error']}"))
        span.end(end_time=self._wall(t_end_ns / 1e6) if t_end_ns else None)

    def shutdown(self) -> None:
        self.drain()
        if self.provider is not None:
            self.provider.force_flush()
            self.provider.shutdown()
        else:
            prov = self._trace.get_tracer_provider()
            if hasattr(prov, "force_flush"):
                prov.force_flush()


# --- per-environment state -----------------------------------------------------------------
class Runtime:
    def __init__(self, environment: Any) -> None:
        self.env = environment
        self.cfg = Config.from_options(environment.parsed_options)
        self.agg = Aggregator()
        self.worker_agg = Aggregator()  # worker: what this worker measured (cumulative)
        self.writer: JsonlWriter | None = None
        self.schedule: Schedule | None = None
        self.prompts: prompts_mod.PromptSet | None = None
        self.tracing: Tracing | None = None
        self.started = False
        self.share = 1.0
        self.finals: dict[str, dict[str, Any]] = {}
        self.final_sent = False
        self.flusher: Any = None
        self.start_wall = 0.0
        self.end_wall = 0.0
        self.last_summary: dict[str, Any] | None = None
        self.monitor: monitor_mod.LoopMonitor | None = None
        self.waits: clientwait.WaitTracker | None = None
        self.next_flush = 0.0
        self.client_wires: dict[str, dict[str, Any]] = {}  # master: each worker's monitor data
        self.metrics: metrics_mod.LoadMetrics | None = None  # Prometheus export (processes that run users)
        self.client: dict[str, Any] | None = None
        self._prompts_key: tuple[Any, ...] | None = None

    # role
    @property
    def role(self) -> str:
        r = self.env.runner
        if isinstance(r, MasterRunner):
            return "master"
        if isinstance(r, WorkerRunner):
            return "worker"
        return "local"

    @property
    def worker(self) -> str:
        r = self.env.runner
        if isinstance(r, WorkerRunner):
            return str(r.worker_index)
        return "local"

    # lifecycle
    def start_test(self) -> None:
        self.cfg = Config.from_options(self.env.parsed_options)  # workers: master's flags have arrived
        self.agg = Aggregator()
        self.worker_agg = Aggregator()
        self.finals = {}
        self.client_wires = {}
        self.client = None
        self.final_sent = False
        self.start_wall = time.time()
        self.started = False
        if self.metrics is not None:
            self.metrics.label = self.cfg.label
        if self.role != "worker":
            if self.writer is not None:
                self.writer.close()
            self.writer = JsonlWriter(os.path.join(self.cfg.out, "records.jsonl")) if self.cfg.records else None
            if self.writer is not None:
                self.writer.open_fresh()
        if self.role in ("local", "worker"):
            self.ensure_started()
        if self.role in ("local", "worker"):
            # this process runs users: watch its event loop for the whole run
            self.monitor = monitor_mod.LoopMonitor().start()
            # and book the time a response waits for the loop as the client's, not the network's
            self.waits = clientwait.WaitTracker().start()
        self.next_flush = time.monotonic() + LOCAL_FLUSH_S
        if self.role == "local":
            # the records are flushed by the users between two requests (after_request); this
            # greenlet only covers a run whose requests outlast the flush interval
            self.flusher = gevent.spawn(self._flush_loop)

    def prepare(self) -> None:
        """Build the prompt set (loads the tokenizer): done at init, before the clock runs."""
        cfg = self.cfg
        key = (
            cfg.prompt_set,
            cfg.prompt,
            cfg.prompt_tokens,
            cfg.prompt_lengths,
            cfg.prompt_file,
            cfg.tokenizer,
            cfg.seed,
        )
        if self._prompts_key != key:
            self.prompts = prompts_mod.build(
                cfg.prompt_set,
                base=cfg.prompt,
                tokens=cfg.prompt_tokens,
                lengths=cfg.prompt_lengths,
                path=cfg.prompt_file or None,
                tokenizer=cfg.tokenizer,
                seed=cfg.seed,
            )
            self._prompts_key = key
            # one route's histograms + the loop monitor's, allocated before the clock runs
            hist.prefill(len(METRICS) + 2)
            # the loop's cached clock went stale while we blocked; timers (Locust's -t) must not fire early
            gevent.get_hub().loop.update_now()

    def ensure_started(self) -> None:
        if self.started:
            return
        cfg = self.cfg
        self.prepare()
        if cfg.arrival in ("constant", "poisson"):
            rate = cfg.rate * self.share
            seed = cfg.seed * 1000 + (int(self.worker) if self.worker.isdigit() else 0)
            self.schedule = Schedule(rate, cfg.arrival, cfg.ramp, seed=seed)
        else:
            self.schedule = None
        if self.tracing is None:
            self.tracing = Tracing.create(cfg, self.env.parsed_options)
        self.started = True

    def _flush_loop(self) -> None:
        while True:
            gevent.sleep(LOCAL_FLUSH_S)
            if time.monotonic() >= self.next_flush + 5 * LOCAL_FLUSH_S:  # no request ended for a while
                self.flush()

    def flush(self) -> None:
        """Records into the histograms and records.jsonl, finished spans to their exporter."""
        self.next_flush = time.monotonic() + LOCAL_FLUSH_S
        if self.role == "local":
            self.flush_local(yielding=True)  # other users' responses are read between slices
        if self.tracing is not None:
            self.tracing.drain()

    def after_request(self) -> None:
        """Called by a user right after it recorded a request and before it sends the next: the
        flushing happens here, outside every timed request of this user (with one user, outside
        every request), instead of on a timer that fires while a response waits for the loop."""
        if time.monotonic() >= self.next_flush:
            self.flush()

    def flush_local(self, yielding: bool = False) -> None:
        """Histograms, JSONL and metrics for the pending records, ``FLUSH_SLICE`` at a time.

        ``yielding`` (the periodic flush): the event loop runs between slices. Each slice is
        taken off ``pending`` only when it is processed, and the greenlet can only be killed at
        the yield, so a flush cut short by the end of the test loses nothing: the rest is still
        pending for the final flush."""
        pending = self.agg.pending
        left = len(pending)  # records added meanwhile wait for the next flush
        while left > 0:
            part = pending[: min(FLUSH_SLICE, left)]
            del pending[: len(part)]
            left -= len(part)
            self.agg.add_batch(part)
            if self.writer is not None:
                self.writer(part)
            if self.metrics is not None:
                self.metrics.observe(part)
            if yielding:
                gevent.sleep(0)

    def serve_metrics(self) -> None:
        """Start the Prometheus endpoint when a port is given (flag or env); once per process."""
        o = self.env.parsed_options
        port = metrics_mod.port_from(getattr(o, "metrics_port", 0))
        if not port or self.metrics is not None:
            return
        host = metrics_mod.host_from(getattr(o, "metrics_host", ""))
        self.metrics = metrics_mod.LoadMetrics(self.cfg.label)
        try:
            self.metrics.serve(host, port)
        except OSError as exc:
            raise ConfigError(f"metrics-port: cannot serve on {host}:{port}: {exc.strerror or exc}") from None
        log.info("pathprobe: Prometheus metrics on http://%s:%d/metrics", host, port)

    def meta(self) -> dict[str, Any]:
        from pathprobe import __version__
        from pathprobe.loadgen.targets import parse_host

        o = self.env.parsed_options
        host = self.env.host or getattr(o, "host", "") or ""
        try:
            kind = parse_host(host)[0]
        except ConfigError:
            kind = None
        import locust

        cfg = self.cfg
        return {
            "host": host,
            "target_kind": kind,
            "stream": cfg.stream,
            "openai_api": cfg.openai_api if kind == "openai" else None,
            "arrival": cfg.arrival,
            "rate": cfg.rate if cfg.arrival != "closed" else None,
            "ramp_s": cfg.ramp if cfg.arrival != "closed" else None,
            "users": getattr(o, "num_users", None),
            "max_tokens": cfg.max_tokens,
            "ignore_eos": cfg.ignore_eos,
            "prompt_set": cfg.prompt_set,
            "prompt_tokens": cfg.prompt_tokens if cfg.prompt_set == "fixed" else None,
            "prompt_lengths": list(cfg.prompt_lengths) if cfg.prompt_set in ("sweep", "mixed") else None,
            "start_wall": self.start_wall,
            "end_wall": self.end_wall or time.time(),
            "duration_s": round((self.end_wall or time.time()) - self.start_wall, 3),
            "label": cfg.label,
            "role": self.role,
            "workers": len(self.finals) if self.role == "master" else None,
            "histogram": "HdrHistogram, 1 us unit, 4 significant figures",
            "versions": {"pathprobe": __version__, "locust": locust.__version__, "python": platform.python_version()},
        }

    def stop_monitor(self) -> dict[str, Any] | None:
        """Stop this process's loop monitor; its wire data (None when it never ran)."""
        if self.waits is not None:
            self.waits.stop()
            self.waits = None
        if self.monitor is None:
            return None
        self.monitor.stop()
        wire = self.monitor.to_wire()
        self.monitor = None
        return wire

    def stop_test_local(self) -> None:
        if self.flusher is not None:
            self.flusher.kill(block=True)
            self.flusher = None
        wire = self.stop_monitor()
        if wire is not None:
            self.client_wires = {"local": wire}
        self.flush_local()
        self.end_wall = time.time()
        self._write()

    def _write(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.client = monitor_mod.merge_blocks(self.client_wires, self.cfg.lag_threshold_ms)
        self.last_summary = write_outputs(self.cfg.out, self.agg, self.meta(), client=self.client)
        for line in monitor_mod.warning_lines(self.client):
            log.warning("pathprobe: %s", line)

    # worker -> master
    def take_delta(self) -> dict[str, Any] | None:
        batch = self.agg.take_pending()
        if not batch:
            return None
        if self.metrics is not None:
            self.metrics.observe(batch)
        delta = Aggregator()
        delta.add_batch(batch)
        self.worker_agg.merge(delta)
        wire = delta.to_wire()
        for r in delta.routes.values():  # reused by the next report instead of allocated again
            for h in r.hists.values():
                hist.recycle(h)
        return {"hists": wire, "records": batch if self.cfg.records else [], "n": len(batch)}

    def send_final(self) -> None:
        if self.final_sent:
            return
        self.final_sent = True
        self.end_wall = time.time()
        wire = self.stop_monitor()
        delta = self.take_delta() or {"hists": {}, "records": [], "n": 0}
        delta["totals"] = self.worker_agg.totals()
        delta["worker"] = self.worker
        delta["client"] = wire
        self.env.runner.send_message(MSG_FINAL, delta)
        try:  # this worker's own view, for checking the master's totals
            own = monitor_mod.merge_blocks({self.worker: wire}, self.cfg.lag_threshold_ms) if wire else None
            write_outputs(self.cfg.out, self.worker_agg, self.meta(), name=f"worker-{self.worker}", client=own)
        except OSError as exc:
            log.warning("pathprobe: cannot write worker summary: %s", exc)
        if self.tracing is not None:
            self.tracing.shutdown()
            self.tracing = None

    def merge_from_worker(self, data: dict[str, Any]) -> None:
        self.agg.merge_wire(data["hists"])
        if self.writer is not None and data.get("records"):
            self.writer(data["records"])


_RUNTIMES: weakref.WeakKeyDictionary[Any, Runtime] = weakref.WeakKeyDictionary()


def runtime(environment: Any) -> Runtime:
    rt = _RUNTIMES.get(environment)
    if rt is None:
        rt = _RUNTIMES[environment] = Runtime(environment)
    return rt


# --- Locust events -------------------------------------------------------------------------
def on_init(environment: Any, **_kw: Any) -> None:
    if getattr(environment.parsed_options, "sweep", "") and not env_vars.get(env_vars.PATHPROBE_SWEEP_CHILD):
        log.warning("pathprobe: --sweep is handled by `pathprobe load`; ignored here")
    rt = runtime(environment)
    runner = environment.runner
    if not isinstance(runner, MasterRunner):
        rt.prepare()  # tokenizer + prompts now, not inside the timed run
        rt.serve_metrics()
    elif metrics_mod.port_from(getattr(environment.parsed_options, "metrics_port", 0)):
        log.warning(
            "pathprobe: --metrics-port is served by the processes that run users (the workers); the master serves none"
        )
    if isinstance(runner, MasterRunner):

        def on_final(environment: Any, msg: Any, **_: Any) -> None:
            rt.merge_from_worker(msg.data)
            rt.finals[msg.node_id] = msg.data.get("totals", {})
            if msg.data.get("client"):
                rt.client_wires[str(msg.data.get("worker", msg.node_id))] = msg.data["client"]

        runner.register_message(MSG_FINAL, on_final)

        @environment.events.worker_report.add_listener
        def on_worker_report(client_id: str, data: dict[str, Any]) -> None:
            pp = data.get("pathprobe")
            if pp:
                rt.merge_from_worker(pp)

    elif isinstance(runner, WorkerRunner):

        def on_share(environment: Any, msg: Any, **_: Any) -> None:
            rt.share = float(msg.data.get("share", 1.0))

        def on_stop(environment: Any, msg: Any, **_: Any) -> None:
            environment.runner.stop()

        runner.register_message(MSG_SHARE, on_share)
        runner.register_message(MSG_STOP, on_stop, concurrent=True)

        @environment.events.report_to_master.add_listener
        def on_report(client_id: str, data: dict[str, Any]) -> None:
            delta = rt.take_delta()
            if delta:
                data["pathprobe"] = delta

    if environment.web_ui is not None:
        from pathprobe.loadgen import webview

        webview.install(environment, rt)


def on_test_start(environment: Any, **_kw: Any) -> None:
    rt = runtime(environment)
    runner = environment.runner
    if isinstance(runner, MasterRunner):
        workers = [c for c in runner.clients.all if c.state != STATE_MISSING]
        share = 1.0 / max(1, len(workers))
        runner.send_message(MSG_SHARE, {"share": share})
    rt.start_test()


def on_test_stopping(environment: Any, **_kw: Any) -> None:
    """Users are about to be stopped: stop sampling the loop (the shutdown is not load)."""
    rt = _RUNTIMES.get(environment)
    if rt is not None and rt.monitor is not None:
        rt.monitor.stop()


def on_test_stop(environment: Any, **_kw: Any) -> None:
    rt = runtime(environment)
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        rt.send_final()
    elif isinstance(runner, MasterRunner):
        _master_collect(rt, runner)
        rt.end_wall = time.time()
        rt._write()
        _check_master_totals(rt)
    else:
        rt.stop_test_local()
        if rt.tracing is not None:
            rt.tracing.shutdown()
            rt.tracing = None


def _master_collect(rt: Runtime, runner: MasterRunner) -> None:
    """Wait until every worker has sent its final batch."""
    expected = {c.id for c in runner.clients.all if c.state != STATE_MISSING}
    if runner.user_count > 0:
        # headless quit path: Locust fires test_stop before telling workers to stop
        runner.send_message(MSG_STOP)
    stop_timeout = float(getattr(rt.env, "stop_timeout", 0) or 0)
    deadline = time.monotonic() + stop_timeout + 30.0
    while not expected <= set(rt.finals) and time.monotonic() < deadline:
        gevent.sleep(0.05)
    missing = expected - set(rt.finals)
    if missing:
        log.error(
            "pathprobe: no final batch from worker(s) %s; totals exclude what they did not ship",
            ", ".join(sorted(missing)),
        )


def _check_master_totals(rt: Runtime) -> None:
    total = rt.agg.totals()["requests"]
    workers = sum(int(t.get("requests", 0)) for t in rt.finals.values())
    if total != workers:
        log.error("pathprobe: master counted %d requests, workers reported %d", total, workers)


def on_quitting(environment: Any, **_kw: Any) -> None:
    rt = _RUNTIMES.get(environment)
    if rt is None or rt.role == "worker":
        return
    if rt.last_summary is not None and getattr(environment.parsed_options, "headless", False):
        print(f"\npathprobe: per-route latency split (ms), files in {os.path.abspath(rt.cfg.out)}", file=sys.stdout)
        print(format_table(rt.last_summary), file=sys.stdout)
        client = rt.last_summary.get("client")
        if client:
            print(monitor_mod.format_line(client), file=sys.stdout)
            for line in monitor_mod.warning_lines(client):
                print(line, file=sys.stdout)
        sys.stdout.flush()


def attach(ev: Any) -> None:
    """Hook pathprobe onto an ``Events`` object (done for Locust's global ``events`` on import;
    call it yourself for an ``Environment`` built with its own ``Events()``)."""
    if getattr(ev, "_pathprobe_attached", False):
        return
    ev.init.add_listener(on_init)
    ev.test_start.add_listener(on_test_start)
    ev.test_stop.add_listener(on_test_stop)
    if hasattr(ev, "test_stopping"):
        ev.test_stopping.add_listener(on_test_stopping)
    ev.quitting.add_listener(on_quitting)
    ev._pathprobe_attached = True


attach(events)
