"""``pathprobe serve``: one engine, a gRPC and an HTTP front end, one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass

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


async def serve(config: ServeConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> None:
    provider = telemetry.setup_tracing("pathprobe-server", traces_file=config.traces_file)
    engine = create_engine(config.engine)
    await engine.start()
    state = ServerState(engine=engine, metrics=ServerMetrics(engine), auth=ApiKeys(config.api_keys))
    runner = web.AppRunner(build_app(state, config.max_body_bytes), access_log=None)
    await runner.setup()
    try:
        ssl_ctx = config.tls.server_context(alpn=("http/1.1",)) if config.tls else None
        site = web.TCPSite(runner, config.host, config.http_port, ssl_context=ssl_ctx)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"--http-port: cannot bind {config.host}:{config.http_port}: {exc.strerror}") from None
        grpc_server, grpc_port = await start_grpc(state, config.host, config.grpc_port, config.tls)
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
        await grpc_server.stop(grace=1.0)
    finally:
        await runner.cleanup()
        await engine.stop()
        telemetry.shutdown(provider)
