"""HTTP upstream calls over one keep-alive pool, with connect-failure failover."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import SimpleNamespace
from typing import TYPE_CHECKING

import aiohttp
from pathprobe import loopwait, rtt, rxstamp, timing
from pathprobe.address import host_and_port
from pathprobe.errors import DeadlineExceeded, Unavailable
from pathprobe.gateway.aio import Spans
from pathprobe.gateway.upstreams import Pool, Upstream
from pathprobe.timing import now_ms
from pathprobe.tls import TlsFiles

if TYPE_CHECKING:
    from opentelemetry.trace import Span


class ConnectTimes:
    """The shortest TCP connect time (ms) seen to each upstream ``H:P``: a transport round trip
    measured without the application, reported as ``gw.connect`` (the network estimate of the
    gateway <-> upstream link when the upstream reports nothing)."""

    def __init__(self) -> None:
        self.by_target: dict[str, float] = {}

    def get(self, target: str) -> float | None:
        return self.by_target.get(target)

    def saw(self, target: str, ms: float) -> None:
        self.by_target[target] = min(ms, self.by_target.get(target, ms))

    async def probe(self, target: str, n: int = 3) -> None:
        """``n`` TCP handshakes to ``target`` in a worker thread (an unreachable upstream: none)."""
        host, port = host_and_port(target)
        ms = await asyncio.get_running_loop().run_in_executor(None, rtt.tcp_handshake_ms, host, port, n, 1.0)
        if ms is not None:
            self.saw(target, ms)

    def trace_config(self) -> aiohttp.TraceConfig:
        tc = aiohttp.TraceConfig()

        async def on_request(
            _s: aiohttp.ClientSession, ctx: SimpleNamespace, params: aiohttp.TraceRequestStartParams
        ) -> None:
            ctx.target = f"{params.url.host}:{params.url.port}"

        async def on_create_start(
            _s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: aiohttp.TraceConnectionCreateStartParams
        ) -> None:
            ctx.connect_t0 = now_ms()

        async def on_create_end(
            _s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: aiohttp.TraceConnectionCreateEndParams
        ) -> None:
            t0 = getattr(ctx, "connect_t0", None)
            if t0 is not None and getattr(ctx, "target", None):
                self.saw(ctx.target, now_ms() - t0)

        tc.on_request_start.append(on_request)
        tc.on_connection_create_start.append(on_create_start)
        tc.on_connection_create_end.append(on_create_end)
        return tc


def make_session(
    pool_size: int, connects: ConnectTimes | None = None, tls: TlsFiles | None = None
) -> aiohttp.ClientSession:
    """One keep-alive pool; with ``tls`` the upstreams are called over HTTPS (mTLS when it has a cert)."""
    conn = aiohttp.TCPConnector(
        limit=0,
        limit_per_host=pool_size,
        keepalive_timeout=75,
        ttl_dns_cache=None,
        force_close=False,
        enable_cleanup_closed=True,
        ssl=tls.client_context(alpn=("http/1.1",)) if tls is not None else True,
    )
    traces = [connects.trace_config()] if connects is not None else None
    return aiohttp.ClientSession(
        connector=conn, auto_decompress=False, skip_auto_headers=("User-Agent",), trace_configs=traces
    )


class SessionOwner:
    """Holds the keep-alive pool to the HTTP upstreams; it is opened on the running loop
    (aiohttp's rule) when serving starts, so it exists only from then on."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def open_session(self, pool_size: int, connects: ConnectTimes | None = None, tls: TlsFiles | None = None) -> None:
        self._session = make_session(pool_size, connects, tls)

    async def close_session(self) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the upstream session is opened when serving starts")
        return self._session


#: of the time from ``gw.upstream``'s start to its request's first send, what is aiohttp's own work on
#: the request (0.3-0.5 ms at c=1 here) and stays with the link's stacks, as an idle loop's gap does
#: (``timing.IDLE_MS``); beyond it the loop was running other requests (``gw.upwait``, its queueing)
SEND_SLACK_MS = timing.IDLE_MS


class UpstreamResponse:
    __slots__ = ("cspan", "resp", "t0", "upstream")

    def __init__(self, upstream: Upstream, resp: aiohttp.ClientResponse, t0: float, cspan: Span | None) -> None:
        self.upstream = upstream
        self.resp = resp
        self.t0 = t0
        self.cspan = cspan

    def _transport(self) -> object:
        # a private name of aiohttp's: it keeps no public handle on a response's connection once a
        # complete answer has released it; without one nothing is measured and the time stays on the link
        return getattr(getattr(self.resp, "_protocol", None), "transport", None)

    def socket_fd(self) -> int | None:
        """The upstream connection's socket, to read how long its answer waited for the loop
        (:func:`pathprobe.loopwait.read_wait_ms`); None: not reachable."""
        return loopwait.fd_of(self._transport())

    def stamped(self) -> rxstamp.StampedSocket | None:
        """The upstream connection's socket, its reads stamped with when their bytes reached the host
        (:func:`pathprobe.rxstamp.stamp_transport`); None: not reachable (the chunks are not stamped)."""
        return rxstamp.stamp_transport(self._transport())

    def send_wait(self, stamped: rxstamp.StampedSocket | None) -> float:
        """How long after ``t0`` (``gw.upstream``'s start) the request's first bytes were handed to the
        upstream socket, beyond :data:`SEND_SLACK_MS`: the gateway's loop, busy with other requests,
        before its request left (at c=32: part of what the packets put on its upstream side). 0 on a
        connection not stamped yet (its first request): then it stays on the link."""
        sent = stamped.sent_after(int(self.t0 * 1e6)) if stamped is not None else None
        return max(0.0, sent / 1e6 - self.t0 - SEND_SLACK_MS) if sent is not None else 0.0


async def request(
    session: aiohttp.ClientSession,
    pool: Pool,
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes | None,
    timeout: float | None,
    spans: Spans,
    scheme: str = "http",
) -> UpstreamResponse:
    """Send the request to a picked upstream; returns with the response headers read.

    The caller must ``release`` the response (and ``pool.release(upstream)``). A refused
    connection (the request never left) is retried on another upstream; anything after
    the request was sent is reported, never retried.
    """
    tried: tuple[Upstream, ...] = ()
    client_timeout = aiohttp.ClientTimeout(total=timeout) if timeout else aiohttp.ClientTimeout(total=None)
    while True:
        u = pool.acquire(tried)
        host, port = host_and_port(u.target)
        t0 = now_ms()  # gw.upstream starts here; the CLIENT span with it
        cspan, carrier = spans.client(
            f"{method} {path.split('?', 1)[0]}",
            {
                "http.request.method": method,
                "server.address": host,
                "server.port": port,
                "url.full": f"{scheme}://{u.target}{path}",
            },
            t0,
        )
        hdrs = dict(headers)
        if carrier:
            for k in ("traceparent", "tracestate", "Traceparent", "Tracestate"):
                hdrs.pop(k, None)
            hdrs.update(carrier)
        try:
            resp = await session.request(
                method,
                f"{scheme}://{u.target}{path}",
                headers=hdrs,
                data=body,
                timeout=client_timeout,
                allow_redirects=False,
            )
        except aiohttp.ClientConnectorError as exc:
            pool.release(u)
            why = _connect_why(exc)
            u.mark(False, f"connect: {why}")
            Spans.end_client(cspan, {}, "connect failed", t0, now_ms() - t0)
            tried += (u,)
            if len(tried) < len(pool.upstreams):
                continue
            raise Unavailable(f"upstream {u.target}: connect failed: {why}") from None
        except TimeoutError:
            pool.release(u)
            Spans.end_client(cspan, {}, "timeout", t0, now_ms() - t0)
            raise DeadlineExceeded(f"upstream {u.target}: no response within {timeout:.3f}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            pool.release(u)
            u.mark(False, str(exc))
            Spans.end_client(cspan, {}, str(exc), t0, now_ms() - t0)
            raise Unavailable(f"upstream {u.target}: {type(exc).__name__}: {exc}") from None
        except BaseException:
            pool.release(u)
            Spans.end_client(cspan, {}, "cancelled", t0, now_ms() - t0)
            raise
        return UpstreamResponse(u, resp, t0, cspan)


def body_error(u: Upstream, exc: BaseException, timeout: float | None) -> Exception:
    """What a failure while reading an upstream body becomes."""
    if isinstance(exc, asyncio.TimeoutError):
        return DeadlineExceeded(f"upstream {u.target}: response not complete within {timeout:.3f}s")
    return Unavailable(f"upstream {u.target}: {type(exc).__name__}: {exc}")


def _connect_why(exc: aiohttp.ClientConnectorError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate: {exc.certificate_error}"
    return str(getattr(exc, "os_error", None) or exc)
