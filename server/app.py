"""``pathprobe serve``: one engine, a gRPC and an HTTP front end, one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

import grpc

from aiohttp import web

from pathprobe import telemetry
from pathprobe.auth import ApiKeys
from pathprobe.server.engine import EngineConfig, create_engine
from pathprobe.errors import ConfigError
from pathprobe.server.core import ServerState
from pathprobe.server.grpc_frontend import start_grpc
from pathprobe.server.http_app import DEFAULT_MAX_BODY, build_app
from pathprobe.server.metrics import ServerMetrics
from pathprobe.tls import TlsFiles

log = logging.getLogger("pathprobe.server")


@dataclass(slots=True)
class ServeConfig:
    engine: EngineConfig
    host: str = "127.0.0.1"
    grpc_port: int = 50051
    http_port: int = 8000
    max_body_bytes: int = DEFAULT_MAX_BODY
    traces_file: str | None = None
    tls: TlsFiles | None = None  # TLS (and mTLS when it has a CA) on both ports
    api_keys: tuple[bytes, ...] = ()  # accepted keys; empty: no authentication
    #: on SIGTERM: seconds health says NOT_SERVING while new requests are still taken (so balancers
    #: take the server out first), then seconds in-flight requests get to finish before they are cut
    drain_delay_s: float = 0.0
    drain_grace_s: float = 30.0


async def serve(config: ServeConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> None:
    provider = telemetry.setup_tracing("pathprobe-server", traces_file=config.traces_file)
    engine = create_engine(config.engine)
    await engine.start()
    state = ServerState(engine=engine, metrics=ServerMetrics(engine), auth=ApiKeys(config.api_keys))
    runner = web.AppRunner(build_app(state, config.max_body_bytes), access_log=None,
                           shutdown_timeout=config.drain_grace_s)
    await runner.setup()
    try:
        ssl_ctx = config.tls.server_context(alpn=("http/1.1",)) if config.tls else None
        site = web.TCPSite(runner, config.host, config.http_port, ssl_context=ssl_ctx)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"--http-port: cannot bind {config.host}:{config.http_port}: {exc.strerror}") from None
        grpc_server, grpc_port, health = await start_grpc(state, config.host, config.grpc_port, config.tls)
        scheme = ("grpcs", "https") if config.tls else ("grpc", "http")
        log.warning("pathprobe serve: engine=%s model=%s grpc=%s://%s:%d http=%s://%s:%d%s", config.engine.kind,
                    engine.model_name, scheme[0], config.host, grpc_port, scheme[1], config.host, config.http_port,
                    " (mTLS)" if config.tls and config.tls.mutual else "")
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready.set()
        await stop.wait()
        await drain(config, state, grpc_server, health, runner)
    finally:
        await runner.cleanup()
        await engine.stop()
        telemetry.shutdown(provider)


async def drain(config: ServeConfig, state: ServerState, grpc_server: grpc.aio.Server, health: Any,
                runner: web.AppRunner) -> None:
    """Graceful stop: NOT_SERVING / 503 first, then no new requests, then in-flight ones finish
    (up to ``drain_grace_s``; what is left after that is cancelled and counted)."""
    t0 = time.monotonic()
    state.draining = True
    await health.enter_graceful_shutdown()  # every service NOT_SERVING, and it stays so
    running = state.engine.running() + state.engine.queue_depth()
    log.warning("draining: health NOT_SERVING, %d request(s) in the engine; new requests stop in %.1f s, "
                "in-flight ones get %.1f s", running, config.drain_delay_s, config.drain_grace_s)
    if config.drain_delay_s > 0:
        await asyncio.sleep(config.drain_delay_s)
    # grpc: new calls refused at once, in-flight ones waited for; aiohttp: listener closed, handlers waited for
    await asyncio.gather(grpc_server.stop(grace=config.drain_grace_s), runner.cleanup())
    left = state.engine.running() + state.engine.queue_depth()
    log.warning("drained in %.2f s (%d request(s) still in the engine)", time.monotonic() - t0, left)
