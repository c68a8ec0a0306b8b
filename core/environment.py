"""Every environment variable pathprobe reads, as a documented constant.

The rule everywhere: an explicit argument (a flag, a constructor argument) wins over the
environment, which wins over the default. The README lists these.
"""

from __future__ import annotations

import os

#: Folder for generated models, tokenizers and prompt sets (default ``~/.cache/pathprobe``).
PATHPROBE_CACHE = "PATHPROBE_CACHE"

#: Also write spans as OTLP JSON lines to this file (``--traces-file`` wins).
PATHPROBE_TRACES_FILE = "PATHPROBE_TRACES_FILE"

#: Also write the GenAI metrics (``gen_ai.client.*`` from the load generator, ``gen_ai.server.*``
#: from the server) as OTLP JSON lines to this file (:mod:`pathprobe.genai`).
PATHPROBE_METRICS_FILE = "PATHPROBE_METRICS_FILE"

#: ``pathprobe serve`` defaults, for containers configured by environment:
#: the engine (``--engine``), the model (``--model``), the HTTP front end (``--http-server``).
PATHPROBE_ENGINE = "PATHPROBE_ENGINE"
PATHPROBE_MODEL = "PATHPROBE_MODEL"
PATHPROBE_HTTP_SERVER = "PATHPROBE_HTTP_SERVER"

#: ``pathprobe load``: serve the live client-side split to Prometheus on this port / address
#: in every process that runs users (``--metrics-port`` / ``--metrics-host`` win).
PATHPROBE_LOAD_METRICS_PORT = "PATHPROBE_LOAD_METRICS_PORT"
PATHPROBE_LOAD_METRICS_HOST = "PATHPROBE_LOAD_METRICS_HOST"

#: Set by ``pathprobe load --sweep`` in the Locust processes it starts (one per level);
#: not meant to be set by hand.
PATHPROBE_SWEEP_CHILD = "PATHPROBE_SWEEP_CHILD"

#: vLLM on a CPU build (``--engine vllm``, vLLM's own server in ``compare``): where vLLM's and
#: torch inductor's caches go when their own variables are unset (default ``/tmp/pathprobe-vllm``).
PATHPROBE_VLLM_SCRATCH = "PATHPROBE_VLLM_SCRATCH"
#: vLLM's own: its CPU worker's KV-cache size in GiB (pathprobe sets 1/16 of memory, 1-8, when unset)
#: and its / torch inductor's cache folders (pathprobe sets them under the scratch folder when unset).
VLLM_CPU_KVCACHE_SPACE = "VLLM_CPU_KVCACHE_SPACE"
VLLM_CACHE_ROOT = "VLLM_CACHE_ROOT"
TORCHINDUCTOR_CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR"
#: The LiteLLM proxy's ``litellm`` executable for compare's ``kind: litellm`` rows (default:
#: ``.venv-litellm/bin/litellm`` under the working directory, then ``litellm`` on PATH).
PATHPROBE_LITELLM = "PATHPROBE_LITELLM"

#: Headers ``pathprobe load`` sends with every request, as a JSON object (e.g. a gateway's
#: API key); compare sets it for LiteLLM's master key, so a secret never shows on a command line.
PATHPROBE_LOAD_HEADERS = "PATHPROBE_LOAD_HEADERS"

#: ``pathprobe compare``'s CPU placement (auto | on | off), over the config's ``placement``.
PATHPROBE_CPU_PLACEMENT = "PATHPROBE_CPU_PLACEMENT"

#: ``pathprobe serve``: the API key clients must send (``--api-key`` wins), and the TLS files of
#: every port: ``PATHPROBE_SERVE_TLS`` is the prefix of ``_CERT`` / ``_KEY`` / ``_CA``.
PATHPROBE_SERVE_API_KEY = "PATHPROBE_SERVE_API_KEY"
PATHPROBE_SERVE_TLS = "PATHPROBE_SERVE_TLS"
PATHPROBE_SERVE_TLS_CERT = "PATHPROBE_SERVE_TLS_CERT"
#: ``pathprobe serve`` option -> its variable (read by :class:`pathprobe.serveconfig.ServeConfig`)
SERVE_OPTIONS: dict[str, str] = {
    "engine": PATHPROBE_ENGINE,
    "model": PATHPROBE_MODEL,
    "http_server": PATHPROBE_HTTP_SERVER,
    "api_key": PATHPROBE_SERVE_API_KEY,
    "tls_cert": PATHPROBE_SERVE_TLS_CERT,
    "tls_key": PATHPROBE_SERVE_TLS + "_KEY",
    "tls_ca": PATHPROBE_SERVE_TLS + "_CA",
}

#: ``pathprobe load``: the API key sent to the target (``--api-key`` wins), and the target's TLS
#: files: ``PATHPROBE_LOAD_TLS`` is the prefix of ``_CA`` / ``_CERT`` / ``_KEY`` / ``_SERVER_NAME``.
PATHPROBE_API_KEY = "PATHPROBE_API_KEY"
PATHPROBE_LOAD_TLS = "PATHPROBE_LOAD_TLS"
PATHPROBE_LOAD_TLS_CA = "PATHPROBE_LOAD_TLS_CA"

#: ``pathprobe gateway``: every option's variable, ``PATHPROBE_GATEWAY_<FLAG>`` (a flag wins).
PATHPROBE_GATEWAY_MODE = "PATHPROBE_GATEWAY_MODE"
PATHPROBE_GATEWAY_LISTEN = "PATHPROBE_GATEWAY_LISTEN"
PATHPROBE_GATEWAY_UPSTREAM = "PATHPROBE_GATEWAY_UPSTREAM"
PATHPROBE_GATEWAY_UPSTREAM_HTTP = "PATHPROBE_GATEWAY_UPSTREAM_HTTP"
PATHPROBE_GATEWAY_BALANCE = "PATHPROBE_GATEWAY_BALANCE"
PATHPROBE_GATEWAY_HEALTH_INTERVAL = "PATHPROBE_GATEWAY_HEALTH_INTERVAL"
PATHPROBE_GATEWAY_HEALTH_TIMEOUT = "PATHPROBE_GATEWAY_HEALTH_TIMEOUT"
PATHPROBE_GATEWAY_UNHEALTHY_AFTER = "PATHPROBE_GATEWAY_UNHEALTHY_AFTER"
PATHPROBE_GATEWAY_TIMEOUT = "PATHPROBE_GATEWAY_TIMEOUT"
PATHPROBE_GATEWAY_MAX_BODY_BYTES = "PATHPROBE_GATEWAY_MAX_BODY_BYTES"
PATHPROBE_GATEWAY_ADMIN_PORT = "PATHPROBE_GATEWAY_ADMIN_PORT"
PATHPROBE_GATEWAY_ADMIN_HOST = "PATHPROBE_GATEWAY_ADMIN_HOST"
PATHPROBE_GATEWAY_THREADS = "PATHPROBE_GATEWAY_THREADS"
PATHPROBE_GATEWAY_WORKERS = "PATHPROBE_GATEWAY_WORKERS"
PATHPROBE_GATEWAY_IMPL = "PATHPROBE_GATEWAY_IMPL"
PATHPROBE_GATEWAY_LOOP = "PATHPROBE_GATEWAY_LOOP"
PATHPROBE_GATEWAY_DECODE_METADATA = "PATHPROBE_GATEWAY_DECODE_METADATA"
PATHPROBE_GATEWAY_GRPC_POLLER = "PATHPROBE_GATEWAY_GRPC_POLLER"
PATHPROBE_GATEWAY_POOL_SIZE = "PATHPROBE_GATEWAY_POOL_SIZE"
PATHPROBE_GATEWAY_TRACES_FILE = "PATHPROBE_GATEWAY_TRACES_FILE"
PATHPROBE_GATEWAY_LOG_LEVEL = "PATHPROBE_GATEWAY_LOG_LEVEL"
PATHPROBE_GATEWAY_TLS_CERT = "PATHPROBE_GATEWAY_TLS_CERT"
PATHPROBE_GATEWAY_TLS_KEY = "PATHPROBE_GATEWAY_TLS_KEY"
PATHPROBE_GATEWAY_TLS_CA = "PATHPROBE_GATEWAY_TLS_CA"
PATHPROBE_GATEWAY_UPSTREAM_TLS = "PATHPROBE_GATEWAY_UPSTREAM_TLS"
PATHPROBE_GATEWAY_UPSTREAM_CA = "PATHPROBE_GATEWAY_UPSTREAM_CA"
PATHPROBE_GATEWAY_UPSTREAM_CERT = "PATHPROBE_GATEWAY_UPSTREAM_CERT"
PATHPROBE_GATEWAY_UPSTREAM_KEY = "PATHPROBE_GATEWAY_UPSTREAM_KEY"
PATHPROBE_GATEWAY_UPSTREAM_SERVER_NAME = "PATHPROBE_GATEWAY_UPSTREAM_SERVER_NAME"
PATHPROBE_GATEWAY_MAX_INFLIGHT = "PATHPROBE_GATEWAY_MAX_INFLIGHT"
PATHPROBE_GATEWAY_RETRY_AFTER_MS = "PATHPROBE_GATEWAY_RETRY_AFTER_MS"
PATHPROBE_GATEWAY_DRAIN_DELAY_S = "PATHPROBE_GATEWAY_DRAIN_DELAY_S"
PATHPROBE_GATEWAY_DRAIN_GRACE_S = "PATHPROBE_GATEWAY_DRAIN_GRACE_S"
PATHPROBE_GATEWAY_API_KEY = "PATHPROBE_GATEWAY_API_KEY"
PATHPROBE_GATEWAY_UPSTREAM_API_KEY = "PATHPROBE_GATEWAY_UPSTREAM_API_KEY"
#: gateway option -> its variable (read by :class:`pathprobe.gateway.config.GatewayConfig`)
GATEWAY_OPTIONS: dict[str, str] = {
    "mode": PATHPROBE_GATEWAY_MODE,
    "listen": PATHPROBE_GATEWAY_LISTEN,
    "upstream": PATHPROBE_GATEWAY_UPSTREAM,
    "upstream_http": PATHPROBE_GATEWAY_UPSTREAM_HTTP,
    "balance": PATHPROBE_GATEWAY_BALANCE,
    "health_interval": PATHPROBE_GATEWAY_HEALTH_INTERVAL,
    "health_timeout": PATHPROBE_GATEWAY_HEALTH_TIMEOUT,
    "unhealthy_after": PATHPROBE_GATEWAY_UNHEALTHY_AFTER,
    "timeout": PATHPROBE_GATEWAY_TIMEOUT,
    "max_body_bytes": PATHPROBE_GATEWAY_MAX_BODY_BYTES,
    "admin_port": PATHPROBE_GATEWAY_ADMIN_PORT,
    "admin_host": PATHPROBE_GATEWAY_ADMIN_HOST,
    "threads": PATHPROBE_GATEWAY_THREADS,
    "workers": PATHPROBE_GATEWAY_WORKERS,
    "impl": PATHPROBE_GATEWAY_IMPL,
    "loop": PATHPROBE_GATEWAY_LOOP,
    "decode_metadata": PATHPROBE_GATEWAY_DECODE_METADATA,
    "grpc_poller": PATHPROBE_GATEWAY_GRPC_POLLER,
    "pool_size": PATHPROBE_GATEWAY_POOL_SIZE,
    "traces_file": PATHPROBE_GATEWAY_TRACES_FILE,
    "log_level": PATHPROBE_GATEWAY_LOG_LEVEL,
    "tls_cert": PATHPROBE_GATEWAY_TLS_CERT,
    "tls_key": PATHPROBE_GATEWAY_TLS_KEY,
    "tls_ca": PATHPROBE_GATEWAY_TLS_CA,
    "upstream_tls": PATHPROBE_GATEWAY_UPSTREAM_TLS,
    "upstream_ca": PATHPROBE_GATEWAY_UPSTREAM_CA,
    "upstream_cert": PATHPROBE_GATEWAY_UPSTREAM_CERT,
    "upstream_key": PATHPROBE_GATEWAY_UPSTREAM_KEY,
    "upstream_server_name": PATHPROBE_GATEWAY_UPSTREAM_SERVER_NAME,
    "max_inflight": PATHPROBE_GATEWAY_MAX_INFLIGHT,
    "retry_after_ms": PATHPROBE_GATEWAY_RETRY_AFTER_MS,
    "drain_delay_s": PATHPROBE_GATEWAY_DRAIN_DELAY_S,
    "drain_grace_s": PATHPROBE_GATEWAY_DRAIN_GRACE_S,
    "api_key": PATHPROBE_GATEWAY_API_KEY,
    "upstream_api_key": PATHPROBE_GATEWAY_UPSTREAM_API_KEY,
}

#: OpenTelemetry's own: where spans go over OTLP/gRPC (the traces-specific one wins).
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
#: ... and where metrics go (the metrics-specific one wins over the general endpoint).
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"

#: Locust's own: the target when ``-H/--host`` is not given.
LOCUST_HOST = "LOCUST_HOST"


def get(name: str, default: str | None = None) -> str | None:
    """The variable's value, or ``default`` when it is unset or empty."""
    value = os.environ.get(name)
    return value if value else default
