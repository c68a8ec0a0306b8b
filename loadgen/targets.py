"""Load targets: the ``--host`` URL -> the transport that measures each call.

- ``grpc://`` / ``grpcs://``: :mod:`pathprobe.loadgen.grpc_targets` (pathprobe's HTTP/2 client
  or grpcio's channel, same records);
- ``http(s)://``, ``openai+http(s)://``, ``ollama+http(s)://``: :mod:`pathprobe.loadgen.http_targets`
  over the measured HTTP client of :mod:`pathprobe.loadgen.http_base`;
- ``openai-sdk+http(s)://``: through the official ``openai`` SDK (:mod:`pathprobe.loadgen.sdk`).

What a call sends and measures (:class:`CallSpec`, :class:`Outcome`, :class:`Target`) is in
:mod:`pathprobe.loadgen.call`; this module re-exports those names.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pathprobe.errors import ConfigError
from pathprobe.loadgen.call import HANDSHAKE_PROBES, CallSpec, Outcome, Target
from pathprobe.loadgen.grpc_targets import GrpcTarget, H2GrpcTarget, PingEstimate, entries_from_call
from pathprobe.loadgen.http_base import ENV_HEADERS, HttpTarget, extra_headers
from pathprobe.loadgen.http_targets import NativeHttpTarget, OllamaTarget, OpenAITarget
from pathprobe.tls import TlsFiles

__all__ = [
    "ENV_HEADERS",
    "GRPC_CLIENTS",
    "HANDSHAKE_PROBES",
    "CallSpec",
    "GrpcTarget",
    "H2GrpcTarget",
    "HttpTarget",
    "NativeHttpTarget",
    "OllamaTarget",
    "OpenAITarget",
    "Outcome",
    "PingEstimate",
    "Target",
    "entries_from_call",
    "extra_headers",
    "make_target",
    "parse_host",
]


def parse_host(host: str) -> tuple[str, str]:
    """``grpc://h:p`` -> ("grpc", "h:p"); ``grpcs://h:p`` -> ("grpc", "h:p") (TLS); ``http(s)://h:p`` ->
    ("http", url); ``openai+http(s)://h:p`` -> ("openai", "http(s)://h:p"); ``openai-sdk+http://h:p`` ->
    ("openai-sdk", ...)."""
    if not host:
        raise ConfigError("host: give the target with -H/--host (grpc://, http://, openai+http://)")
    parts = urlsplit(host)
    scheme = parts.scheme.lower()
    if scheme in ("grpc", "grpcs"):
        if not parts.netloc:
            raise ConfigError(f"host: expected {scheme}://HOST:PORT, got {host!r}")
        return "grpc", parts.netloc
    if scheme in ("http", "https"):
        return "http", host.rstrip("/")
    if scheme in ("openai-sdk+http", "openai-sdk+https"):  # through the official openai SDK
        return "openai-sdk", f"{scheme.split('+', 1)[1]}://{parts.netloc}{parts.path}".rstrip("/")
    if scheme in ("openai+http", "openai+https", "openai"):
        inner = scheme.split("+", 1)[1] if "+" in scheme else "http"
        return "openai", f"{inner}://{parts.netloc}{parts.path}".rstrip("/")
    if scheme in ("ollama+http", "ollama+https"):  # Ollama's native API (its timing fields)
        return "ollama", f"{scheme.split('+', 1)[1]}://{parts.netloc}{parts.path}".rstrip("/")
    raise ConfigError(
        f"host: unknown scheme in {host!r}; use grpc(s)://, http(s)://, openai+http(s)://, "
        "openai-sdk+http:// or ollama+http://"
    )


#: gRPC client implementations a load run can use (``--grpc-client``)
GRPC_CLIENTS = ("h2", "grpcio")


def make_target(
    host: str,
    timeout_s: float = 60.0,
    openai_api: str = "completions",
    grpc_client: str = "h2",
    tls: TlsFiles | None = None,
    api_key: str = "",
) -> Target:
    """``tls``: CA / client certificate for grpcs:// and https:// (unset: the system CAs); grpcs://
    goes over grpcio's channel (the h2 client speaks plaintext HTTP/2)."""
    kind, addr = parse_host(host)
    if kind == "grpc":
        if grpc_client not in GRPC_CLIENTS:
            raise ConfigError(f"grpc-client: expected one of {', '.join(GRPC_CLIENTS)}, got {grpc_client!r}")
        if urlsplit(host).scheme.lower() == "grpcs":
            return GrpcTarget(addr, timeout_s, tls or TlsFiles(), api_key)
        return (
            H2GrpcTarget(addr, timeout_s, api_key)
            if grpc_client == "h2"
            else GrpcTarget(addr, timeout_s, None, api_key)
        )
    if kind == "http":
        return NativeHttpTarget(addr, timeout_s, tls, api_key)
    if kind == "ollama":
        return OllamaTarget(addr, timeout_s)
    if kind == "openai-sdk":
        from pathprobe.loadgen.sdk import OpenAISdkTarget

        return OpenAISdkTarget(addr, timeout_s, openai_api)
    return OpenAITarget(addr, timeout_s, openai_api, tls, api_key)
