"""Health probe for containers: ``python -m pathprobe.probe URL`` exits 0 when healthy.

    grpc://HOST:PORT[/SERVICE]   gRPC health checking protocol (SERVING), e.g. the server's
                                 gRPC port or a passthrough gateway (the call crosses it)
    http://HOST:PORT/PATH        HTTP 200, e.g. ``/healthz`` of the server or a transcoding gateway

Docker's HEALTHCHECK and Kubernetes exec probes run it; images ship nothing else for it.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from urllib.parse import urlsplit

from pathprobe.errors import ConfigError


def check_grpc(target: str, service: str, timeout: float) -> str | None:
    """None when SERVING, else why not."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    if resp.status != health_pb2.HealthCheckResponse.SERVING:
        name: str = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        return name
    return None


def check_http(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except OSError as exc:
        return str(getattr(exc, "reason", exc))


def check(url: str, timeout: float = 2.0) -> str | None:
    parts = urlsplit(url)
    if parts.scheme == "grpc" and parts.port:
        return check_grpc(f"{parts.hostname}:{parts.port}", parts.path.lstrip("/"), timeout)
    if parts.scheme in ("http", "https") and parts.port:
        return check_http(url, timeout)
    raise ConfigError(f"url: expected grpc://HOST:PORT[/SERVICE] or http://HOST:PORT/PATH, got {url!r}")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        why = check(args[0])
    except ConfigError as exc:
        print(f"pathprobe.probe: error: {exc.message}", file=sys.stderr)
        return 2
    if why is not None:
        print(f"unhealthy: {args[0]}: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
