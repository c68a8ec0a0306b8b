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

#: Set by ``pathprobe load --sweep`` in the Locust processes it starts (one per level);
#: not meant to be set by hand.
PATHPROBE_SWEEP_CHILD = "PATHPROBE_SWEEP_CHILD"

#: OpenTelemetry's own: where spans go over OTLP/gRPC (the traces-specific one wins).
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"

#: Locust's own: the target when ``-H/--host`` is not given.
LOCUST_HOST = "LOCUST_HOST"


def get(name: str, default: str | None = None) -> str | None:
    """The variable's value, or ``default`` when it is unset or empty."""
    value = os.environ.get(name)
    return value if value else default
