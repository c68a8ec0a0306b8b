"""HTTP upstream calls over one keep-alive pool, with connect-failure failover."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp

from pathprobe.address import host_and_port
from pathprobe.errors import DeadlineExceeded, Unavailable
from pathprobe.gateway.aio import Spans
from pathprobe.gateway.upstreams import Pool, Upstream
from pathprobe.timing import now_ms
from pathprobe.tls import TlsFiles


def make_session(pool_size: int, tls: TlsFiles | None = None) -> aiohttp.ClientSession:
    """One keep-alive pool; with ``tls`` the upstreams are called over HTTPS (mTLS when it has a cert)."""
    conn = aiohttp.TCPConnector(limit=0, limit_per_host=pool_size, keepalive_timeout=75, ttl_dns_cache=None,
                                force_close=False, enable_cleanup_closed=True,
                                ssl=tls.client_context(alpn=("http/1.1",)) if tls is not None else True)
    return aiohttp.ClientSession(connector=conn, auto_decompress=False, skip_auto_headers=("User-Agent",))


class UpstreamResponse:
    __slots__ = ("cspan", "resp", "t0", "upstream")

    def __init__(self, upstream: Upstream, resp: aiohttp.ClientResponse, t0: float, cspan: Any) -> None:
        self.upstream = upstream
        self.resp = resp
        self.t0 = t0
        self.cspan = cspan


async def request(session: aiohttp.ClientSession, pool: Pool, method: str, path: str,
                  headers: Mapping[str, str], body: bytes | None, timeout: float | None,
                  spans: Spans, scheme: str = "http") -> UpstreamResponse:
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
        cspan, carrier = spans.client(f"{method} {path.split('?', 1)[0]}", {
            "http.request.method": method, "server.address": host, "server.port": port,
            "url.full": f"{scheme}://{u.target}{path}"}, t0)
        hdrs = dict(headers)
        if carrier:
            for k in ("traceparent", "tracestate", "Traceparent", "Tracestate"):
                hdrs.pop(k, None)
            hdrs.update(carrier)
        try:
            resp = await session.request(method, f"{scheme}://{u.target}{path}", headers=hdrs, data=body,
                                         timeout=client_timeout, allow_redirects=False)
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
