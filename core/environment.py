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

#: OpenTelemetry's own: where spans go over OTLP/gRPC (the traces-specific one wins).
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"

#: Locust's own: the target when ``-H/--host`` is not given.
LOCUST_HOST = "LOCUST_HOST"


def get(name: str, default: str | None = None) -> str | None:
    """The variable's value, or ``default`` when it is unset or empty."""
    value = os.environ.get(name)
    return value if value else default
