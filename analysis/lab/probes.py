"""Probes of a path: real requests that tell when a server, gateway or proxy answers, what a
new connection's TLS handshake costs, and what a server reports about itself."""

from __future__ import annotations

import json
import socket
import statistics
import time
import urllib.request
from typing import TYPE_CHECKING

from pathprobe import environment
from pathprobe.analysis.lab.procs import Managed, split_hostport
from pathprobe.errors import PathprobeError

if TYPE_CHECKING:
    from pathprobe.tls import TlsFiles


def parse_startup(metrics_text: str) -> dict[str, float]:
    """``pathprobe_server_startup_ms{phase=...}`` gauges from a Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "pathprobe_server_startup_ms":
            for sample in family.samples:
                out[sample.labels["phase"]] = sample.value
    return out


def url_for(protocol: str, hostport: str, tls: bool = False) -> str:
    scheme = {"grpc": "grpc", "http": "http", "openai": "openai+http", "openai-sdk": "openai-sdk+http"}[protocol]
    return f"{scheme}{'s' if tls else ''}://{hostport}"


def normalize_address(address: str, protocol: str) -> str:
    """A load-generator URL from an address that may lack its scheme."""
    if "://" in address:
        return address
    return url_for(protocol, address)


def served_model(http_address: str, timeout: float = 10.0) -> str:
    """The first model id a server lists on ``GET /v1/models`` (what LiteLLM is told to ask for)."""
    try:
        with urllib.request.urlopen(f"http://{http_address}/v1/models", timeout=timeout) as resp:
            data = json.loads(resp.read()).get("data") or [{}]
        return str(data[0].get("id") or "default")
    except (OSError, ValueError) as exc:
        raise PathprobeError(f"GET http://{http_address}/v1/models failed: {exc}") from None


def probe_once(
    url: str,
    model: str | None = None,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
    tls: TlsFiles | None = None,
) -> float:
    """One real 1-token request over ``url``; returns its latency in ms or raises.
    ``tls``: the client's TlsFiles for grpcs:// / https:// (None: the environment's, else system CAs).
    ``headers`` go as HTTP headers, or as gRPC metadata (lower-cased) on gRPC."""
    from pathprobe.tls import TlsFiles, grpc_channel

    secure = url.split("://", 1)[0].endswith("s")
    if secure and tls is None:
        tls = TlsFiles.from_env(environment.PATHPROBE_LOAD_TLS, flag="--target")
    ssl_ctx = tls.client_context() if secure and tls is not None else None
    t0 = time.perf_counter()
    if url.startswith(("grpc://", "grpcs://")):
        from pathprobe.v1 import llm_pb2, llm_pb2_grpc

        with grpc_channel(url.split("://", 1)[1], tls if secure else None) as ch:
            stub = llm_pb2_grpc.LLMStub(ch)
            metadata = [(k.lower(), v) for k, v in (headers or {}).items()]
            stub.Generate(
                llm_pb2.GenerateRequest(prompt="Hello", max_tokens=1, model=model or ""),
                timeout=timeout,
                metadata=metadata or None,
            )
    else:
        if url.startswith("openai+"):
            base = url[len("openai+") :].rstrip("/")
            path, body = "/v1/completions", {"prompt": "Hello", "max_tokens": 1, "model": model or ""}
            if not model:
                with urllib.request.urlopen(
                    urllib.request.Request(base + "/v1/models", headers=headers or {}), timeout=timeout, context=ssl_ctx
                ) as resp:
                    models = json.loads(resp.read()).get("data") or [{}]
                body["model"] = models[0].get("id", "")
        else:
            base = url.rstrip("/")
            path, body = "/v1/generate", {"prompt": "Hello", "max_tokens": 1}
        req = urllib.request.Request(
            base + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=timeout, context=ssl_ctx) as resp:
            resp.read()
    return (time.perf_counter() - t0) * 1e3


def handshake_ms(hostport: str, tls: TlsFiles, n: int = 20) -> tuple[float, float]:
    """Median TCP connect and TCP connect + TLS handshake times (ms) over ``n`` fresh connections:
    what a new connection costs, apart from the measured (keep-alive, steady state) requests."""
    host, port = split_hostport(hostport)
    ctx = tls.client_context(alpn=("h2", "http/1.1"))
    tcp, both = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        with socket.create_connection((host, port), timeout=5) as sock:
            t1 = time.perf_counter()
            with ctx.wrap_socket(sock, server_hostname=host):
                t2 = time.perf_counter()
        tcp.append((t1 - t0) * 1e3)
        both.append((t2 - t0) * 1e3)
    return statistics.median(tcp), statistics.median(both)


def wait_ready(
    url: str,
    timeout: float,
    procs: list[Managed],
    model: str | None = None,
    headers: dict[str, str] | None = None,
    tls: TlsFiles | None = None,
) -> float:
    """Probe until the path answers a real request; raise with the reason on timeout or exit."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        for p in procs:
            code = p.exit_code()
            if code is not None:
                raise PathprobeError(f"{p.name} exited with code {code} while starting: {p.tail()}")
        try:
            return probe_once(
                url, model, timeout=min(10.0, max(1.0, deadline - time.monotonic())), headers=headers, tls=tls
            )
        except Exception as exc:  # any failure means: not ready yet
            details_fn = getattr(exc, "details", None)  # a grpc.RpcError's message
            details = details_fn() if callable(details_fn) else None
            text = str(details or exc).strip()
            last = text.splitlines()[0][:300] if text else type(exc).__name__
        time.sleep(0.2)
    raise PathprobeError(f"{url} not ready after {timeout:.0f} s: {last}")
