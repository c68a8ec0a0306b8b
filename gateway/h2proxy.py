"""``passthrough`` as an HTTP/2 frame relay: gRPC forwarded without terminating it.

Each client connection is paired with one upstream connection (chosen by the pool's
balancing policy when the client connects). Frames are relayed as they are: SETTINGS,
PING, WINDOW_UPDATE, DATA, RST_STREAM, GOAWAY and the header blocks keep their bytes, so
flow control, deadlines (``grpc-timeout``), metadata (``traceparent`` and custom keys) and
cancellation (RST_STREAM in either direction) work end to end exactly as without the
gateway, and the gRPC message bytes are never looked at. The relay changes one thing: the
header block that ends a stream from the upstream (the trailers) gets one more field,
``server-timing`` with the gateway's ``gw.*`` entries, encoded as an HPACK literal without
indexing so neither side's header table moves (the client's gRPC library merges both
``server-timing`` values into its trailing metadata; :func:`pathprobe.timing.from_metadata`
reads them together).

Header blocks are HPACK-decoded *after* they have been forwarded, for metrics (method,
status) only, so decoding is off the latency path. With tracing on, request header blocks
are decoded before forwarding and re-encoded as literals carrying the gateway's CLIENT
span in ``traceparent``.

When the upstream connection dies, every call in flight on it ends with ``UNAVAILABLE``
naming the upstream, then the client connection gets GOAWAY and is closed; the client's
next calls open a new connection, which the pool sends to a healthy upstream. A refused
upstream connection is retried on the next upstream before anything is sent.

Trade-off: balancing is per client connection (like an L4 balancer), not per call; use
``--impl grpc`` for per-call balancing over one client connection.

Modules: this one serves the relay (listener, drain on SIGTERM);
:mod:`~pathprobe.gateway.h2settings` is the relay's settings, one frozen value built here once;
:mod:`~pathprobe.gateway.h2conn` relays one client connection and its upstream connection;
:mod:`~pathprobe.gateway.h2headers` reads and rewrites header blocks;
:mod:`~pathprobe.gateway.h2streams` is a call's record, timing entries and error trailers;
:mod:`~pathprobe.gateway.h2spans` its spans. Frames are parsed in one place,
:func:`pathprobe.h2frames.frames`; upstream picking and health are
:mod:`~pathprobe.gateway.upstreams`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys

from pathprobe import loopwait
from pathprobe.gateway.config import GatewayConfig
from pathprobe.gateway.h2conn import ClientConn
from pathprobe.gateway.h2settings import RelaySettings
from pathprobe.gateway.metrics import Metrics
from pathprobe.gateway.upstreams import Pool

log = logging.getLogger("pathprobe.gateway")


class Relay:
    """The relay's settings, shared by every client connection, and the connections open."""

    def __init__(self, settings: RelaySettings) -> None:
        self.settings = settings
        self.clients: set[ClientConn] = set()

    def connection(self) -> ClientConn:
        """A new client connection (the listener's protocol factory)."""
        return ClientConn(self.settings, self.clients)


async def drain(relay: Relay, server: asyncio.Server, delay_s: float, grace_s: float) -> None:
    """SIGTERM: listener closed (after ``delay_s``), GOAWAY to every client naming the last stream
    it opened (the client sends later calls elsewhere), in-flight streams get ``grace_s``."""
    relay.settings.pool.draining = True
    if delay_s > 0:
        await asyncio.sleep(delay_s)
    server.close()
    for c in list(relay.clients):
        c.goaway()
    deadline = asyncio.get_running_loop().time() + grace_s
    while any(c.streams for c in relay.clients) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    left = sum(len(c.streams) for c in relay.clients)
    if left:
        log.warning("drain: %d stream(s) still open after %.1f s; closing", left, grace_s)
    for c in list(relay.clients):
        if c.transport is not None:
            c.transport.close()


def serve(cfg: GatewayConfig, pool: Pool, metrics: Metrics | None, tracing: bool) -> int:
    children: list[subprocess.Popen] = []
    if cfg.workers > 1 and not cfg.worker_child:
        for _ in range(1, cfg.workers):
            children.append(subprocess.Popen([sys.executable, "-m", "pathprobe", *sys.argv[1:], "--worker-child"]))
    relay = Relay(RelaySettings.build(cfg, pool, metrics, tracing))
    ssl_ctx = cfg.tls.server_context(alpn=("h2",)) if cfg.tls else None

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loopwait.install(loop)  # gw.wait (an asyncio loop only: uvloop has no Python selector to watch)
        server = await loop.create_server(
            relay.connection, cfg.listen_host, cfg.listen_port, reuse_port=True, backlog=1024, ssl=ssl_ctx
        )
        bound = server.sockets[0].getsockname()[1]
        print(
            f"pathprobe gateway: passthrough (HTTP/2 frame relay) listening on {cfg.listen_host}:{bound} -> "
            f"{pool.names()}",
            flush=True,
        )
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await drain(relay, server, cfg.drain_delay_s, cfg.drain_grace_s)

    try:
        loop = cfg.loop
        if loop == "auto":
            try:
                import uvloop

                loop = "uvloop"
            except ImportError:
                loop = "asyncio"
        if loop == "uvloop":
            import uvloop

            uvloop.run(main())
        else:
            asyncio.run(main())
    finally:
        for c in children:
            c.send_signal(signal.SIGTERM)
        for c in children:
            try:
                c.wait(5)
            except subprocess.TimeoutExpired:
                c.kill()
    return 0
