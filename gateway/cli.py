"""``pathprobe gateway``: a proxy in front of one or more model servers.

Modes: ``passthrough`` (gRPC bytes forwarded untouched), ``transcode`` (HTTP/JSON in,
gRPC upstream), ``reencode`` (gRPC in, the server's HTTP/JSON upstream) and
``http-proxy`` (HTTP in, HTTP out). Heavy imports happen inside :func:`run`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

MODES = ("passthrough", "transcode", "reencode", "http-proxy")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("gateway", help="proxy gRPC/HTTP to model servers, adding gw.* timing",
                              description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--mode", choices=MODES, default="passthrough")
    p.add_argument("--listen", default="127.0.0.1:8600", metavar="HOST:PORT",
                   help="address to serve on (port 0 picks a free one)")
    p.add_argument("--upstream", metavar="HOST:PORT[,HOST:PORT...]",
                   help="model servers: their gRPC port (passthrough, transcode) or HTTP port (reencode, http-proxy)")
    p.add_argument("--upstream-http", metavar="HOST:PORT[,...]",
                   help="HTTP upstreams for reencode / http-proxy (default: --upstream)")
    p.add_argument("--balance", choices=("round-robin", "least-outstanding"), default="round-robin")
    p.add_argument("--health-interval", type=float, default=1.0, metavar="S",
                   help="seconds between active health checks (0 = off)")
    p.add_argument("--health-timeout", type=float, default=1.0, metavar="S")
    p.add_argument("--unhealthy-after", type=int, default=2, metavar="N",
                   help="consecutive failed checks that take an upstream out")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="upstream timeout when the caller sets no deadline (HTTP callers never do)")
    p.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024,
                   help="largest request body / message accepted (RESOURCE_EXHAUSTED / HTTP 413 above)")
    p.add_argument("--admin-port", type=int, default=0, help="serve Prometheus /metrics here (0 = off)")
    p.add_argument("--admin-host", default=None, help="default: the --listen host")
    p.add_argument("--threads", type=int, default=64, help="passthrough: handler threads (= concurrent calls)")
    p.add_argument("--workers", type=int, default=1,
                   help="passthrough: processes sharing the port with SO_REUSEPORT")
    p.add_argument("--worker-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=("h2", "grpc"), default="h2",
                   help="passthrough: relay HTTP/2 streams (h2, like nginx) or terminate gRPC with grpcio (grpc)")
    p.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto",
                   help="passthrough h2: event loop (auto = uvloop when installed: measured ~10%% less added latency)")
    p.add_argument("--no-decode-metadata", action="store_true",
                   help="passthrough h2: skip HPACK-decoding headers for metrics (method/status labels become '?')")
    p.add_argument("--grpc-poller", choices=("legacy", "default"), default="legacy",
                   help="passthrough: grpcio's older poller does fewer thread hand-offs per call (measured faster)")
    p.add_argument("--pool-size", type=int, default=64, help="HTTP upstream keep-alive connections per upstream")
    p.add_argument("--traces-file", help="also write spans to this OTLP JSON lines file")
    p.add_argument("--log-level", default="WARNING", type=str.upper, choices=LOG_LEVELS)
    p.set_defaults(func=run)


def _check_numbers(args: argparse.Namespace) -> None:
    from pathprobe.errors import ConfigError

    at_least_one = ("max_body_bytes", "workers", "threads", "unhealthy_after", "pool_size")
    for name in at_least_one:
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    for name in ("timeout", "health_timeout"):
        if not getattr(args, name) > 0:  # also rejects nan
            raise ConfigError(f"--{name.replace('_', '-')}: must be > 0 seconds, got {getattr(args, name)}")
    if not args.health_interval >= 0:
        raise ConfigError(f"--health-interval: must be >= 0 seconds (0 = off), got {args.health_interval}")
    if not 0 <= args.admin_port <= 65535:
        raise ConfigError(f"--admin-port: must be a TCP port, 0..65535 (0 = off), got {args.admin_port}")


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
    import logging

    from pathprobe.errors import ConfigError
    from pathprobe.gateway.common import parse_hostport, parse_upstreams

    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                        format="%(asctime)s gateway %(levelname)s %(message)s")
    args.listen_host, args.listen_port = parse_hostport(args.listen, "--listen")
    http_upstream = args.mode in ("reencode", "http-proxy")
    raw = (args.upstream_http or args.upstream) if http_upstream else args.upstream
    if not raw:
        flag = "--upstream-http or --upstream" if http_upstream else "--upstream"
        raise ConfigError(f"{flag}: required for --mode {args.mode}")
    targets = parse_upstreams(raw, "--upstream-http" if http_upstream and args.upstream_http else "--upstream")
    _check_numbers(args)
    if args.workers > 1 and args.listen_port == 0:
        raise ConfigError("--workers: the processes share one port; give --listen a fixed port, not 0")
    if not args.worker_child:
        _check_free(args.listen_host, args.listen_port, "--listen")

    if args.mode == "passthrough" and args.impl == "grpc" and args.grpc_poller == "legacy" and "GRPC_EXPERIMENTS" not in os.environ \
            and "gateway" in sys.argv:
        # The poller is chosen when grpc core starts: re-exec with it set (same pid).
        from pathprobe.gateway.passthrough import LEGACY_POLLER

        env = {**os.environ, "GRPC_EXPERIMENTS": LEGACY_POLLER}
        os.execve(sys.executable, [sys.executable, "-m", "pathprobe", *sys.argv[1:]], env)

    from pathprobe import telemetry
    from pathprobe.gateway.metrics import Metrics
    from pathprobe.gateway.upstreams import HealthChecker, Pool

    provider = telemetry.setup_tracing("pathprobe-gateway", traces_file=args.traces_file,
                                       attributes={"pathprobe.gateway.mode": args.mode})
    pool = Pool(targets, "http" if http_upstream else "grpc", args.balance)
    metrics = Metrics(args.mode, pool)
    if args.admin_port and not args.worker_child:
        admin_host = args.admin_host or args.listen_host
        try:
            metrics.serve(admin_host, args.admin_port)
        except OSError as exc:
            raise ConfigError(f"--admin-port: cannot bind {admin_host}:{args.admin_port}: {exc.strerror}") from None
    health = HealthChecker(pool, args.health_interval, args.health_timeout, args.unhealthy_after).start()
    try:
        if args.mode == "passthrough" and args.impl == "h2":
            from pathprobe.gateway.h2proxy import serve as serve_h2

            return serve_h2(args, pool, metrics, provider is not None)
        if args.mode == "passthrough":
            from pathprobe.gateway.passthrough import serve

            return serve(args, pool, metrics, provider is not None)
        if args.mode == "transcode":
            from pathprobe.gateway.transcode import serve as serve_transcode

            return serve_transcode(args, pool, metrics, provider is not None)
        if args.mode == "reencode":
            from pathprobe.gateway.reencode import serve as serve_reencode

            return serve_reencode(args, pool, metrics, provider is not None)
        from pathprobe.gateway.httpproxy import serve as serve_http

        return serve_http(args, pool, metrics, provider is not None)
    finally:
        health.stop()
        telemetry.shutdown(provider)
