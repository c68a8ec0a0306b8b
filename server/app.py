"""``pathprobe serve``: one engine, a gRPC and an HTTP front end, one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pathprobe import genai, loopwait, models, telemetry
from pathprobe.auth import ApiKeys
from pathprobe.errors import ConfigError
from pathprobe.gputelemetry import GpuSampler
from pathprobe.serveconfig import ServeConfig
from pathprobe.server.core import ServerState
from pathprobe.server.engine import EngineConfig, create_engine
from pathprobe.server.grpc_frontend import start_grpc
from pathprobe.server.http_app import build_app
from pathprobe.server.metrics import ServerMetrics
from pathprobe.server.startup import StartupTimer
from pathprobe.timing import now_ms
from pathprobe.tls import TlsFiles

if TYPE_CHECKING:  # pragma: no cover
    import grpc
    from grpc_health.v1 import health as grpc_health

log = logging.getLogger("pathprobe.server")
_tracer = telemetry.get_tracer("pathprobe.server")


class _HttpFrontEnd:
    """Start/stop of the HTTP front end chosen by ``ServeConfig.http_server``."""

    def __init__(
        self,
        kind: str,
        host: str,
        port: int,
        max_body_bytes: int,
        state: ServerState,
        tls: TlsFiles | None = None,
        grace_s: float = 30.0,
    ) -> None:
        self.kind, self.host, self.port, self.max_body_bytes = kind, host, port, max_body_bytes
        self.state = state
        self.tls = tls
        self.grace_s = grace_s
        self._runner: web.AppRunner | None = None
        self._uvicorn: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            if self.kind == "fastapi":
                await self._start_fastapi()
            else:
                # cleanup() closes the listener, then waits up to grace_s for in-flight handlers
                self._runner = web.AppRunner(
                    build_app(self.state, self.max_body_bytes), access_log=None, shutdown_timeout=self.grace_s
                )
                await self._runner.setup()
                ssl_ctx = self.tls.server_context(alpn=("http/1.1",)) if self.tls else None
                await web.TCPSite(self._runner, self.host, self.port, ssl_context=ssl_ctx).start()
                self.port = self._runner.addresses[0][1]  # the bound port (port 0 picks a free one)
        except OSError as exc:
            raise ConfigError(f"HTTP port ({self.kind}): cannot bind {self.host}:{self.port}: {exc.strerror}") from None

    async def _start_fastapi(self) -> None:
        import socket

        import uvicorn
        from pathprobe.server.fastapi_app import build_app as build_fastapi

        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: uvicorn writes a response's head and body apart, and
        # without it each response waits ~40 ms for the client's delayed ACK (Nagle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((self.host, self.port))  # bind here, so a busy port is a clear error before serving
        self.port = sock.getsockname()[1]
        tls = self.tls
        ssl_kw: dict[str, Any] = {}
        if tls is not None:
            import ssl

            ssl_kw = {"ssl_certfile": tls.cert, "ssl_keyfile": tls.key}
            if tls.ca:
                ssl_kw.update(ssl_ca_certs=tls.ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
        cfg = uvicorn.Config(
            build_fastapi(self.state, self.max_body_bytes),
            log_level="warning",
            access_log=False,
            lifespan="off",
            http="httptools",
            loop="none",
            timeout_graceful_shutdown=math.ceil(self.grace_s),
            **ssl_kw,
        )
        self._uvicorn = uvicorn.Server(cfg)
        # serve() owns SIGINT/SIGTERM (drain first): uvicorn >= 0.29 swaps the handlers in while it serves
        # (Server.capture_signals) and would start its own shutdown at once; keep them out
        self._uvicorn.capture_signals = contextlib.nullcontext
        self._task = asyncio.create_task(self._uvicorn.serve(sockets=[sock]))
        while not self._uvicorn.started:
            if self._task.done():
                self._task.result()
                raise ConfigError("--http-server fastapi: uvicorn stopped before serving")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._uvicorn is not None and self._task is not None:
            self._uvicorn.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
        if self._runner is not None:
            await self._runner.cleanup()


def _on_cuda(engine: object) -> bool:
    return str(getattr(engine, "device", "")).startswith("cuda")


def _phase(phases: dict[str, float], name: str, since: float) -> float:
    now = time.perf_counter()
    phases[name] = now - since
    return now


async def serve(config: ServeConfig, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> None:
    t0 = now_ms()
    loopwait.install()  # srv.wait of the HTTP front ends (grpc.aio's calls are not seen: left in network)
    # coarse breakdown (pathprobe_server_startup_seconds, the dashboard's); the engine's own
    # phases (StartupTimer) go to pathprobe_server_startup_ms, the table and the spans
    phases: dict[str, float] = {}
    t = time.perf_counter()
    provider = telemetry.setup_tracing("pathprobe-server", traces_file=config.traces_file)
    t = _phase(phases, "tracing", t)
    # the model is resolved once per start, here, and handed to the engine (and its process)
    model = models.resolve(config.model, config.model_name)
    engine = create_engine(EngineConfig.from_serve(config), model)
    t = _phase(phases, "engine_create", t)
    gpu = GpuSampler().start() if _on_cuda(engine) else None
    await engine.start()
    t = _phase(phases, "engine_start", t)
    startup: StartupTimer = getattr(engine, "startup", None) or StartupTimer(t0=t0)
    otlp_metrics = genai.setup_otlp("pathprobe-server")
    metrics = ServerMetrics(engine, otlp=otlp_metrics)
    state = ServerState(engine=engine, metrics=metrics, auth=ApiKeys(config.api_keys))
    if gpu is not None:
        state.metrics.watch_gpu(gpu)
    fronts = [
        _HttpFrontEnd(kind, config.host, port, config.max_body_bytes, state, config.tls, config.drain_grace_s)
        for kind, port in ((config.http_server, config.http_port), *config.extra_http_server)
    ]
    try:
        with startup.phase("frontends"):
            for front in fronts:
                await front.start()
            grpc_server, grpc_port, health = await start_grpc(
                state, config.host, config.grpc_port, config.tls, config.max_body_bytes
            )
        _watch_engine(engine, health)
        _phase(phases, "listeners", t)
        state.metrics.set_startup(phases)
        ready_ms = now_ms() - t0
        report_startup(startup, state, t0, ready_ms)
        scheme = ("grpcs", "https") if config.tls else ("grpc", "http")
        log.warning(
            "pathprobe serve: engine=%s model=%s grpc=%s://%s:%d http=%s://%s:%d (%s)%s",
            config.engine,
            engine.model_name,
            scheme[0],
            config.host,
            grpc_port,
            scheme[1],
            config.host,
            fronts[0].port,
            config.http_server,
            " (mTLS)" if config.tls and config.tls.mutual else "",
        )
        if gpu is not None and not gpu.available:
            log.warning("GPU telemetry: %s", gpu.unavailable)
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready.set()
        await stop.wait()
        await drain(config, state, grpc_server, health, fronts)
    finally:
        for front in fronts:
            await front.stop()
        await engine.stop()
        if gpu is not None:
            summary = gpu.stop()
            if summary.get("gpu"):
                log.warning("GPU telemetry: %s", json.dumps(summary, default=str))
        telemetry.shutdown(provider)
        if otlp_metrics is not None:
            otlp_metrics.shutdown()


def _watch_engine(engine: object, health: grpc_health.aio.HealthServicer) -> None:
    """An engine process that dies takes the server out of its balancers: health NOT_SERVING."""
    if not hasattr(engine, "on_down"):
        return

    pending: list[asyncio.Future[None]] = []

    def down(why: str) -> None:
        log.error("engine down: %s; health NOT_SERVING, every request fails UNAVAILABLE", why)
        pending.append(asyncio.ensure_future(health.enter_graceful_shutdown()))

    engine.on_down = down


def report_startup(startup: StartupTimer, state: ServerState, t0: float, ready_ms: float) -> None:
    """Print the startup table, export it as spans and gauges; add the first request later."""
    print(startup.table(ready_ms), flush=True)
    state.metrics.set_startup_phases({"total": ready_ms, **startup.as_dict()})
    root = _tracer.start_span(
        "server.startup", start_time=telemetry.mono_ms_to_wall_ns(t0), attributes={"pathprobe.startup_ms": ready_ms}
    )
    for ph in startup.ordered():
        telemetry.child_span(
            _tracer,
            f"startup.{ph.name}",
            root,
            ph.start,
            ph.ms,
            {"pathprobe.startup.phase": ph.name, "pathprobe.startup.note": ph.note},
        )
    root.end(end_time=telemetry.mono_ms_to_wall_ns(t0 + ready_ms))

    def first(start: float, total_ms: float) -> None:
        startup.record("first_request", start, total_ms)
        state.metrics.set_startup_phases({"first_request": total_ms})
        print(
            f"{'first_request':<16} {total_ms:>10.1f}  (srv.total of the first request, "
            f"{(start - t0) / 1000:.1f} s after start)",
            flush=True,
        )
        span = _tracer.start_span(
            "startup.first_request",
            start_time=telemetry.mono_ms_to_wall_ns(start),
            attributes={"pathprobe.startup.phase": "first_request"},
        )
        span.end(end_time=telemetry.mono_ms_to_wall_ns(start + total_ms))

    state.on_first_request = first


async def drain(
    config: ServeConfig,
    state: ServerState,
    grpc_server: grpc.aio.Server,
    health: grpc_health.aio.HealthServicer,
    fronts: list[_HttpFrontEnd],
) -> None:
    """Graceful stop: NOT_SERVING / 503 first, then no new requests, then in-flight ones finish
    (up to ``drain_grace_s``; what is left after that is cancelled, and counted as such)."""
    t0 = time.monotonic()
    state.draining = True
    await health.enter_graceful_shutdown()  # every service NOT_SERVING, and it stays so
    log.warning(
        "draining: health NOT_SERVING, %d request(s) in the engine; new requests stop in %.1f s, "
        "in-flight ones get %.1f s",
        state.engine.running() + state.engine.queue_depth(),
        config.drain_delay_s,
        config.drain_grace_s,
    )
    if config.drain_delay_s > 0:
        await asyncio.sleep(config.drain_delay_s)
    # gRPC: new calls refused at once, in-flight ones waited for; HTTP: listeners closed, handlers waited for
    await asyncio.gather(grpc_server.stop(grace=config.drain_grace_s), *(f.stop() for f in fronts))
    log.warning(
        "drained in %.2f s (%d request(s) still in the engine)",
        time.monotonic() - t0,
        state.engine.running() + state.engine.queue_depth(),
    )
