"""``pathprobe gateway``: a proxy in front of one or more model servers.

Modes: ``passthrough`` (gRPC bytes forwarded untouched), ``transcode`` (HTTP/JSON in,
gRPC upstream), ``reencode`` (gRPC in, the server's HTTP/JSON upstream) and
``http-proxy`` (HTTP in, HTTP out). Heavy imports happen inside :func:`run`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

MODES = ("passthrough", "transcode", "reencode", "http-proxy")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


if TYPE_CHECKING:
    from pathprobe.gateway.config import GatewayConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Flags default to None so :class:`GatewayConfig` can apply the environment, then its defaults."""
    from pathprobe.gateway.config import ENV

    p = subparsers.add_parser(
        "gateway",
        help="proxy gRPC/HTTP to model servers, adding gw.* timing",
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog="Every flag can also come from the environment variable "
        "PATHPROBE_GATEWAY_<FLAG> (e.g. " + ENV["upstream"] + "); a flag wins.",
    )
    p.add_argument("--mode", choices=MODES, help="default: passthrough")
    p.add_argument(
        "--listen", metavar="HOST:PORT", help="address to serve on (port 0 picks a free one; default 127.0.0.1:8600)"
    )
    p.add_argument(
        "--upstream",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="model servers: their gRPC port (passthrough, transcode) or HTTP port (reencode, http-proxy)",
    )
    p.add_argument(
        "--upstream-http",
        metavar="HOST:PORT[,...]",
        help="HTTP upstreams for reencode / http-proxy (default: --upstream)",
    )
    p.add_argument("--balance", choices=("round-robin", "least-outstanding"), help="default: round-robin")
    p.add_argument(
        "--health-interval", type=float, metavar="S", help="seconds between active health checks (0 = off; default 1)"
    )
    p.add_argument("--health-timeout", type=float, metavar="S", help="default 1")
    p.add_argument(
        "--unhealthy-after",
        type=int,
        metavar="N",
        help="consecutive failed checks that take an upstream out (default 2)",
    )
    p.add_argument(
        "--timeout", type=float, metavar="S", help="upstream timeout when the caller sets no deadline (default 600)"
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        help="largest request body / message accepted (RESOURCE_EXHAUSTED / HTTP 413 above; default 4 MiB)",
    )
    p.add_argument("--admin-port", type=int, help="serve Prometheus /metrics here (0 = off, the default)")
    p.add_argument("--admin-host", help="default: the --listen host")
    p.add_argument("--threads", type=int, help="passthrough grpc: handler threads (= concurrent calls; default 64)")
    p.add_argument("--workers", type=int, help="passthrough: processes sharing the port with SO_REUSEPORT (default 1)")
    p.add_argument("--worker-child", action="store_const", const=True, help=argparse.SUPPRESS)
    p.add_argument(
        "--impl",
        choices=("h2", "grpc"),
        help="passthrough: relay HTTP/2 streams (h2, like nginx; the default) or terminate gRPC with grpcio (grpc)",
    )
    p.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        help="passthrough h2: event loop (auto, the default = uvloop when installed: measured ~10%% less "
        "added latency)",
    )
    p.add_argument(
        "--no-decode-metadata",
        dest="decode_metadata",
        action="store_const",
        const=False,
        help="passthrough h2: skip HPACK-decoding headers for metrics (method/status labels become '?')",
    )
    p.add_argument(
        "--grpc-poller",
        choices=("legacy", "default"),
        help="passthrough grpc: grpcio's older poller (legacy, the default) does fewer thread hand-offs "
        "per call (measured faster)",
    )
    p.add_argument(
        "--pool-size",
        type=int,
        help="upstream connections per upstream: HTTP keep-alive (http-proxy, reencode), HTTP/2 with one call "
        "each until all are busy (transcode) (default 64)",
    )
    p.add_argument("--traces-file", help="also write spans to this OTLP JSON lines file")
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, help="default WARNING")
    p.add_argument(
        "--max-inflight",
        type=int,
        metavar="N",
        help="calls in flight per upstream at most; past it 429 / RESOURCE_EXHAUSTED at once (0 = no cap)",
    )
    p.add_argument(
        "--retry-after-ms",
        type=float,
        metavar="MS",
        help="retry hint of such a refusal (Retry-After / grpc-retry-pushback-ms; default 1000)",
    )
    p.add_argument(
        "--drain-delay-s",
        type=float,
        metavar="S",
        help="on SIGTERM: seconds health says NOT_SERVING before new calls are refused (default 0)",
    )
    p.add_argument(
        "--drain-grace-s",
        type=float,
        metavar="S",
        help="on SIGTERM: seconds in-flight calls get to finish (default 30)",
    )
    a = p.add_argument_group("auth")
    a.add_argument(
        "--api-key",
        metavar="KEY[,KEY...]",
        help="require 'authorization: Bearer KEY' (or 'x-api-key') from clients (401 / UNAUTHENTICATED)",
    )
    a.add_argument(
        "--upstream-api-key",
        metavar="KEY",
        help="send 'authorization: Bearer KEY' upstream instead of the client's credential "
        "(default: the client's goes upstream unchanged)",
    )
    t = p.add_argument_group("TLS")
    t.add_argument("--tls-cert", help="serve TLS to clients with this certificate chain (PEM)")
    t.add_argument("--tls-key", help="its private key (PEM)")
    t.add_argument("--tls-ca", help="require client certificates signed by this CA (mTLS)")
    t.add_argument(
        "--upstream-tls",
        action="store_const",
        const=True,
        help="call the upstreams over TLS (verified against --upstream-ca, else the system CAs)",
    )
    t.add_argument("--upstream-ca", help="CA that signs the upstreams' certificates (implies --upstream-tls)")
    t.add_argument("--upstream-cert", help="client certificate for upstreams that want mTLS")
    t.add_argument("--upstream-key", help="its private key")
    t.add_argument("--upstream-server-name", help="name expected in the upstreams' certificates (default: the host)")
    p.set_defaults(func=run)


def _check_free(host: str, port: int, flag: str) -> None:
    """Fail before serving when another process listens on HOST:PORT.

    The listeners set SO_REUSEPORT (for ``--workers``), which would otherwise let this gateway
    silently share the port with whatever already listens there; a plain bind does not.
    """
    import socket

    from pathprobe.errors import ConfigError

    if port == 0:
        return
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are fine
        sock.bind((host, port))
    except OSError as exc:
        raise ConfigError(f"{flag}: cannot bind {host}:{port}: {exc.strerror}") from None
    finally:
        sock.close()


def run(args: argparse.Namespace) -> int:
    from pathprobe.gateway.config import GatewayConfig

    return serve(GatewayConfig.from_values(vars(args)))


def serve(cfg: GatewayConfig) -> int:
    """Run the gateway described by a :class:`~pathprobe.gateway.config.GatewayConfig`."""
    import logging

    logging.basicConfig(
        level=getattr(logging, str(cfg.log_level).upper(), logging.WARNING),
        format="%(asctime)s gateway %(levelname)s %(message)s",
    )
    from pathprobe.errors import ConfigError

    if cfg.workers > 1 and cfg.listen_port == 0:
        raise ConfigError("--workers: the processes share one port; give --listen a fixed port, not 0")
    if not cfg.worker_child:
        _check_free(cfg.listen_host, cfg.listen_port, "--listen")

    if (
        cfg.mode == "passthrough"
        and cfg.impl == "grpc"
        and cfg.grpc_poller == "legacy"
        and "GRPC_EXPERIMENTS" not in os.environ
        and "gateway" in sys.argv
    ):
        # The poller is chosen when grpc core starts: re-exec with it set (same pid).
        from pathprobe.gateway.passthrough import LEGACY_POLLER

        env = {**os.environ, "GRPC_EXPERIMENTS": LEGACY_POLLER}
        os.execve(sys.executable, [sys.executable, "-m", "pathprobe", *sys.argv[1:]], env)

    from pathprobe import telemetry
    from pathprobe.gateway.metrics import Metrics
    from pathprobe.gateway.upstreams import HealthChecker, Pool

    provider = telemetry.setup_tracing(
        "pathprobe-gateway", traces_file=cfg.traces_file, attributes={"pathprobe.gateway.mode": cfg.mode}
    )
    pool = Pool(cfg.targets, "http" if cfg.http_upstream else "grpc", cfg.balance, cfg.max_inflight, cfg.retry_after_ms)
    metrics = Metrics(cfg.mode, pool)
    if cfg.admin_port and not cfg.worker_child:
        admin_host = cfg.admin_host or cfg.listen_host
        try:
            metrics.serve(admin_host, cfg.admin_port)
        except OSError as exc:
            raise ConfigError(f"--admin-port: cannot bind {admin_host}:{cfg.admin_port}: {exc.strerror}") from None
    health = HealthChecker(
        pool, cfg.health_interval, cfg.health_timeout, cfg.unhealthy_after, cfg.upstream_tls_files
    ).start()
    tracing = provider is not None
    try:
        if cfg.mode == "passthrough" and cfg.impl == "h2":
            from pathprobe.gateway.h2proxy import serve as serve_h2

            return serve_h2(cfg, pool, metrics, tracing)
        if cfg.mode == "passthrough":
            from pathprobe.gateway.passthrough import serve as serve_grpc

            return serve_grpc(cfg, pool, metrics, tracing)
        if cfg.mode == "transcode":
            from pathprobe.gateway.transcode import serve as serve_transcode

            return serve_transcode(cfg, pool, metrics, tracing)
        if cfg.mode == "reencode":
            from pathprobe.gateway.reencode import serve as serve_reencode

            return serve_reencode(cfg, pool, metrics, tracing)
        from pathprobe.gateway.httpproxy import serve as serve_http

        return serve_http(cfg, pool, metrics, tracing)
    finally:
        health.stop()
        telemetry.shutdown(provider)
