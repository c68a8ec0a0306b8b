"""``pathprobe serve``: one engine, a gRPC and an HTTP front end, one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass

from aiohttp import web

from pathprobe import telemetry
from pathprobe.server.engine import EngineConfig, create_engine
from pathprobe.errors import ConfigError
from pathprobe.server.core import ServerState
from pathprobe.server.grpc_frontend import start_grpc
from pathprobe.server.http_app import DEFAULT_MAX_BODY, build_app
from pathprobe.server.metrics import ServerMetrics

log = logging.getLogger("pathprobe.server")


@dataclass(slots=True)
class ServeConfig:
    engine: EngineConfig
    host: str = "127.0.0.1"
    grpc_port: int = 50051
    http_port: int = 8000
    max_body_bytes: int = DEFAULT_MAX_BODY
    traces_file: str | None = None


def _phase(phases: dict[str, float], name: str, since: float) -> float:
    now = time.perf_counter()
    phases[name] = now - since
    return now


async def serve(config: ServeConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> None:
    phases: dict[str, float] = {}  # startup breakdown, exported as pathprobe_server_startup_seconds
    t = time.perf_counter()
    provider = telemetry.setup_tracing("pathprobe-server", traces_file=config.traces_file)
    t = _phase(phases, "tracing", t)
    engine = create_engine(config.engine)
    t = _phase(phases, "engine_create", t)
    await engine.start()
    t = _phase(phases, "engine_start", t)
    state = ServerState(engine=engine, metrics=ServerMetrics(engine))
    runner = web.AppRunner(build_app(state, config.max_body_bytes), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.http_port)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"--http-port: cannot bind {config.host}:{config.http_port}: {exc.strerror}") from None
        grpc_server, grpc_port = await start_grpc(state, config.host, config.grpc_port)
        _phase(phases, "listeners", t)
        state.metrics.set_startup(phases)
        log.warning("pathprobe serve: engine=%s model=%s grpc=%s:%d http=http://%s:%d", config.engine.kind,
                    engine.model_name, config.host, grpc_port, config.host, config.http_port)
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
