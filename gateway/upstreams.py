"""Upstream set: balancing (round-robin, least-outstanding) and active health checks.

The pool is shared by every mode. Health checks run on one daemon thread (a gRPC
``grpc.health.v1.Health/Check`` for gRPC upstreams, ``GET /healthz`` for HTTP ones), so
they work the same under the sync passthrough server and the asyncio modes. A failed
check (or a connect failure seen by a real call) takes an upstream out; the next passing
check puts it back.
"""

from __future__ import annotations

import http.client
import logging
import ssl
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pathprobe.address import host_and_port
from pathprobe.errors import ResourceExhausted, Unavailable
from pathprobe.tls import TlsFiles

if TYPE_CHECKING:
    import grpc

log = logging.getLogger("pathprobe.gateway")


class Upstream:
    __slots__ = ("client", "failures", "healthy", "index", "kind", "outstanding", "target")

    def __init__(self, target: str, kind: str, index: int) -> None:
        self.target = target
        self.kind = kind  # "grpc" | "http"
        self.index = index
        self.healthy = True  # optimistic until the first check says otherwise
        self.outstanding = 0
        self.failures = 0
        self.client: Any = None  # mode-specific (a channel, a session, ...)

    def mark(self, healthy: bool, why: str = "") -> None:
        if healthy:
            self.failures = 0
        if healthy != self.healthy:
            self.healthy = healthy
            log.warning(
                "upstream %s is now %s%s",
                self.target,
                "healthy" if healthy else "UNHEALTHY",
                f" ({why})" if why else "",
            )

    def __repr__(self) -> str:
        return f"Upstream({self.target}, healthy={self.healthy}, outstanding={self.outstanding})"


def _outstanding(u: Upstream) -> int:
    return u.outstanding


class Pool:
    """Picks an upstream per call; tracks outstanding calls per upstream."""

    def __init__(
        self,
        targets: Iterable[str],
        kind: str,
        balance: str = "round-robin",
        max_inflight: int = 0,
        retry_after_ms: float = 1000.0,
    ) -> None:
        self.upstreams = [Upstream(t, kind, i) for i, t in enumerate(targets)]
        #: calls in flight per upstream at most (0: no cap); past it a call is refused at once
        self.max_inflight = max_inflight
        self.retry_after_ms = retry_after_ms
        self.kind = kind
        self.balance = balance
        self._lock = threading.Lock()
        self._rr = 0
        self._single = self.upstreams[0] if len(self.upstreams) == 1 else None
        #: the gateway got SIGTERM: its own health answers NOT_SERVING / 503 from now on
        self.draining = False

    def names(self) -> str:
        return ",".join(u.target for u in self.upstreams)

    def any_healthy(self) -> bool:
        return any(u.healthy for u in self.upstreams)

    def acquire(self, exclude: tuple[Upstream, ...] = ()) -> Upstream:
        """Pick an upstream and count the call as outstanding on it (call :meth:`release`)."""
        with self._lock:
            single = self._single
            cap = self.max_inflight
            if single is not None:
                if exclude:
                    raise Unavailable(f"upstream {single.target}: unavailable (no other upstream to try)")
                if cap and single.outstanding >= cap:
                    raise self.full()
                single.outstanding += 1
                return single
            ups = [u for u in self.upstreams if u.healthy and u not in exclude]
            if cap:
                open_ = [u for u in ups if u.outstanding < cap]
                if ups and not open_:
                    raise self.full()
                ups = open_
            if not ups:
                # Health data may be stale: try the others anyway rather than refuse outright.
                ups = [u for u in self.upstreams if u not in exclude]
                if not ups:
                    raise Unavailable(f"no healthy upstream among {self.names()}")
            self._rr += 1
            n = len(ups)
            if self.balance == "least-outstanding":
                start = self._rr % n
                # the first with the fewest calls in flight, counting from the round-robin position
                u = min((ups[(start + i) % n] for i in range(n)), key=_outstanding)
            else:
                u = ups[self._rr % n]
            u.outstanding += 1
            return u

    def full(self) -> ResourceExhausted:
        return ResourceExhausted(
            f"every upstream has {self.max_inflight} calls in flight (--max-inflight); retry later",
            retry_after_ms=self.retry_after_ms,
        )

    def over_cap(self, u: Upstream) -> bool:
        """For callers that count first (the h2 relay): is ``u`` past the cap now?"""
        return bool(self.max_inflight) and u.outstanding > self.max_inflight

    def release(self, u: Upstream) -> None:
        with self._lock:
            u.outstanding -= 1


# ---------------------------------------------------------------------------------- health


def check_grpc(
    target: str, channels: dict[str, grpc.Channel], timeout: float, tls: TlsFiles | None = None
) -> tuple[bool, str]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from pathprobe.tls import grpc_channel

    ch = channels.get(target)
    if ch is None:
        ch = channels[target] = grpc_channel(target, tls)
    try:
        resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
    except grpc.RpcError as exc:
        return False, f"health check: {exc.code().name}"
    ok = resp.status == health_pb2.HealthCheckResponse.SERVING
    return ok, "" if ok else f"health status {health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)}"


def check_http(
    target: str, timeout: float, path: str = "/healthz", ssl_ctx: ssl.SSLContext | None = None
) -> tuple[bool, str]:
    host, port = host_and_port(target)
    conn = (
        http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl_ctx)
        if ssl_ctx is not None
        else http.client.HTTPConnection(host, port, timeout=timeout)
    )
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200, f"GET {path} -> {resp.status}"
    except OSError as exc:
        return False, f"GET {path}: {exc}"
    finally:
        conn.close()


class HealthChecker:
    """Checks every upstream every ``interval`` seconds on a daemon thread."""

    def __init__(
        self, pool: Pool, interval: float = 1.0, timeout: float = 1.0, fall: int = 1, tls: TlsFiles | None = None
    ) -> None:
        self.pool = pool
        self.tls = tls
        self._ssl_ctx = tls.client_context() if tls is not None else None
        self.interval = interval
        self.timeout = timeout
        self.fall = max(1, fall)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._channels: dict[str, grpc.Channel] = {}

    def check_once(self) -> None:
        for u in self.pool.upstreams:
            if u.kind == "grpc":
                ok, why = check_grpc(u.target, self._channels, self.timeout, self.tls)
            else:
                ok, why = check_http(u.target, self.timeout, ssl_ctx=self._ssl_ctx)
            if ok:
                u.mark(True)
            else:
                u.failures += 1
                if u.failures >= self.fall:
                    u.mark(False, why)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check_once()
            except Exception:  # a checker bug must not kill the gateway
                log.exception("health check failed")

    def start(self) -> HealthChecker:
        if self.interval > 0:
            self._thread = threading.Thread(target=self._run, name="gw-health", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for ch in self._channels.values():
            ch.close()
