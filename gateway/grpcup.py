"""gRPC calls to a gateway's upstream on the gateway's own event loop, their bytes stamped on arrival.

grpc.aio reads its answers in gRPC core's threads and hands them to the loop through a poller
socket. When the gateway's loop is busy with its other requests (c=32), an answer sits in the
process until the loop gets to it, and nothing the gateway has can tell when it came: the split
booked that as the upstream link's network (transcode, c=32 on loopback: 6.3 ms of unary calls,
~21 ms of 32-token streams, where the packet witness put the time in the gateway's stack).

This client speaks gRPC over one HTTP/2 connection per upstream (the protocol from ``h2``) on an
asyncio transport the loop itself selects on, its reads stamped by the kernel
(:func:`pathprobe.rxstamp.stamp_transport`). Every message and every call's end carries when the
bytes that completed it had reached the host (``arrived_ms``: the later of the kernel's stamp and
the loop's floor for the socket, :mod:`pathprobe.loopwait`), so the gateway's wait for its own loop
is its queueing (``gw.upwait``, ``gw.backlog``), not the link's.

The surface is the part of grpc.aio's call a gateway uses: ``await call`` (unary), ``async for``
(server streaming), :meth:`Call.trailing_metadata`, :meth:`Call.done`, :meth:`Call.cancel`; a
failure raises :class:`grpc.aio.AioRpcError` as grpc.aio does, with the status mapped from HTTP and
RST_STREAM codes as gRPC's PROTOCOL-HTTP2 says. Covered: multiplexing within the peer's
MAX_CONCURRENT_STREAMS, flow control both ways, deadlines (``grpc-timeout`` sent; the stream reset
and DEADLINE_EXCEEDED at expiry), cancellation, GOAWAY (later calls on a new connection; the streams
it refused fail UNAVAILABLE), TLS with ALPN ``h2`` (its reads are not stamped: the loop's floor
only), binary (``-bin``) metadata; the ``grpc-timeout`` it writes is declared as written
(:mod:`pathprobe.grpcwait`), so our server measures how long it held the call. Not covered:
compression (the client asks for ``identity``), client streaming.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import struct
from collections import deque
from collections.abc import AsyncIterator, Generator, Sequence
from urllib.parse import unquote

import grpc
import grpc.aio
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from pathprobe import grpcwait, loopwait, rxstamp
from pathprobe.address import host_and_port
from pathprobe.deadline import format_timeout, parse_timeout
from pathprobe.errors import http_to_grpc
from pathprobe.tls import TlsFiles

Metadata = Sequence[tuple[str, str | bytes]]

#: our receive windows (connection and stream): wide, so a large answer never waits on them
WINDOW = (1 << 31) - 1
STREAM_WINDOW = 16 << 20
#: RST_STREAM error code -> gRPC status (gRPC's PROTOCOL-HTTP2 mapping); others INTERNAL
RST_TO_GRPC = {
    ErrorCodes.REFUSED_STREAM: grpc.StatusCode.UNAVAILABLE,
    ErrorCodes.CANCEL: grpc.StatusCode.CANCELLED,
    ErrorCodes.ENHANCE_YOUR_CALM: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCodes.INADEQUATE_SECURITY: grpc.StatusCode.PERMISSION_DENIED,
}
#: connections per upstream at most (the gateway's ``--pool-size``)
POOL_SIZE = 64
_PREFIX = struct.Struct(">BI")  # a message's compressed flag and length
_CODES = {c.value[0]: c for c in grpc.StatusCode}


def _error(code: grpc.StatusCode, details: str, trailing: Metadata = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details)


class Call:
    """One call: its messages as they come (each with when its bytes reached the host), its end."""

    __slots__ = (
        "_conn",
        "_ended",
        "_error",
        "_expiry",
        "_messages",
        "_pending",
        "_status",
        "_trailing",
        "_waiter",
        "arrived_ms",
        "ended_ms",
        "sid",
    )

    def __init__(self) -> None:
        self.sid = 0
        self._conn: _Connection | None = None
        self._messages: deque[tuple[bytes, float | None]] = deque()
        self._pending = b""  # the part of a message that has come so far
        self._waiter: asyncio.Future[None] | None = None
        self._status: int | None = None  # grpc-status from the headers or trailers
        self._trailing: list[tuple[str, str | bytes]] = []
        self._error: grpc.aio.AioRpcError | None = None
        self._ended = False
        self._expiry: asyncio.TimerHandle | None = None
        #: when the bytes of the message last handed out had reached the host (None: not known)
        self.arrived_ms: float | None = None
        #: when the bytes that ended the call (its trailers, or a reset) had reached the host
        self.ended_ms: float | None = None

    # ------------------------------------------------------------------ the caller's side
    def __await__(self) -> Generator[None, None, bytes]:
        """The one answer of a unary call."""
        while not self._ended:
            yield from self._wait().__await__()
        self._raise()
        if len(self._messages) != 1:
            raise _error(grpc.StatusCode.INTERNAL, f"expected one response message, got {len(self._messages)}")
        raw, self.arrived_ms = self._messages.popleft()
        return raw

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        while True:
            if self._messages:
                raw, self.arrived_ms = self._messages.popleft()
                yield raw
            elif self._ended:
                self._raise()
                return
            else:
                await self._wait()

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        while not self._ended:
            await self._wait()
        return grpc.aio.Metadata(*self._trailing)

    def done(self) -> bool:
        return self._ended

    def failure(self) -> grpc.aio.AioRpcError | None:
        """How the call failed, once it has ended (None: not ended, or OK)."""
        return self._error

    def cancel(self) -> bool:
        """Reset the stream (CANCEL); False when the call had already ended."""
        if self._ended:
            return False
        if self._conn is not None:
            self._conn.reset(self, ErrorCodes.CANCEL)
        self._end(None, _error(grpc.StatusCode.CANCELLED, "Locally cancelled"))
        return True

    def _wait(self) -> asyncio.Future[None]:
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    # ------------------------------------------------------------------ the connection's side
    def _data(self, data: bytes, at: float | None) -> None:
        buf = self._pending + data if self._pending else data
        i = 0
        while len(buf) - i >= _PREFIX.size:
            flag, n = _PREFIX.unpack_from(buf, i)
            if len(buf) - i - _PREFIX.size < n:
                break
            if flag:
                self._fail(grpc.StatusCode.INTERNAL, "compressed message: the client asked for identity")
                return
            self._messages.append((buf[i + _PREFIX.size : i + _PREFIX.size + n], at))
            i += _PREFIX.size + n
        self._pending = buf[i:]
        self._wake()

    def _headers(self, headers: list[tuple[bytes, bytes]], at: float | None, ended: bool) -> None:
        """Response headers (or trailers): an HTTP status other than 200 without a gRPC status is the
        HTTP mapping's; a gRPC status is kept for the end."""
        status = None
        for k, v in headers:
            if k == b":status":
                status = int(v)
            elif k == b"grpc-status":
                self._status = int(v)
            elif k == b"grpc-message":
                self._trailing.append(("grpc-message", unquote(v.decode())))
            elif not k.startswith(b":") and ended:
                key = k.decode()
                self._trailing.append((key, base64.b64decode(v + b"==") if key.endswith("-bin") else v.decode()))
        if status is not None and status != 200 and self._status is None:
            self._fail(http_to_grpc(status), f"Received http2 header with status: {status}", at)
        elif ended:
            self._finish(at)

    def _finish(self, at: float | None) -> None:
        """The stream ended (END_STREAM): its gRPC status decides."""
        details = next((str(v) for k, v in self._trailing if k == "grpc-message"), "")
        trailing = [(k, v) for k, v in self._trailing if k != "grpc-message"]
        self._trailing = trailing
        if self._pending:
            self._end(at, _error(grpc.StatusCode.INTERNAL, "the stream ended inside a message", trailing))
        elif self._status is None:
            self._end(at, _error(grpc.StatusCode.INTERNAL, "the stream ended without a grpc-status", trailing))
        elif self._status != 0:
            code = _CODES.get(self._status, grpc.StatusCode.UNKNOWN)
            self._end(at, _error(code, details, trailing))
        else:
            self._end(at, None)

    def _fail(self, code: grpc.StatusCode, details: str, at: float | None = None) -> None:
        if self._conn is not None:
            self._conn.reset(self, ErrorCodes.CANCEL)
        self._end(at, _error(code, details, self._trailing))

    def _end(self, at: float | None, error: grpc.aio.AioRpcError | None) -> None:
        if self._ended:
            return
        self._ended = True
        self.ended_ms = at
        self._error = error
        if self._expiry is not None:
            self._expiry.cancel()
        if self._conn is not None:
            self._conn.forget(self)
        self._wake()


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection to the upstream, its calls multiplexed on it."""

    def __init__(self, authority: str, scheme: str) -> None:
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config)
        self.authority = authority.encode()
        self.scheme = scheme.encode()
        self.transport: asyncio.Transport | None = None
        self.stamped: rxstamp.StampedSocket | None = None
        self.fd: int | None = None
        self.calls: dict[int, Call] = {}
        self.closing = False  # GOAWAY in, or lost: no new calls
        self._room = asyncio.Event()  # a stream slot, or flow-control window, opened
        self._lost = "connection not made"

    # ------------------------------------------------------------------ asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.stamped = rxstamp.stamp_transport(transport)
        self.fd = loopwait.fd_of(transport)
        self.h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(WINDOW - 65535)
        self._flush()

    def data_received(self, data: bytes) -> None:
        at = self._arrival()
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._lose(f"HTTP/2 protocol error from the upstream: {exc}")
            return
        for ev in events:
            self._event(ev, at)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._lose(f"Socket closed{f': {exc}' if exc else ''}")

    # ------------------------------------------------------------------ calls
    async def start(self, call: Call, path: str, payload: bytes, metadata: Metadata, timeout: float | None) -> None:
        """Open ``call``'s stream and send its request (waiting for a stream slot and for window)."""
        while self.h2.open_outbound_streams >= self.h2.remote_settings.max_concurrent_streams and not self.closing:
            await self._wait_room()
        if self.closing:
            raise _error(grpc.StatusCode.UNAVAILABLE, self._lost)
        sid = self.h2.get_next_available_stream_id()
        headers = [
            (b":method", b"POST"),
            (b":scheme", self.scheme),
            (b":path", path.encode()),
            (b":authority", self.authority),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (b"grpc-accept-encoding", b"identity"),
        ]
        if timeout is not None:  # sent, and declared as sent: the server measures how long it held the call
            sent = format_timeout(timeout)
            headers.append((b"grpc-timeout", sent.encode()))
            headers.append((grpcwait.METADATA_KEY.encode(), f"{(parse_timeout(sent) or 0) * 1000:.0f}".encode()))
        for k, v in metadata:
            key = k.lower()
            raw = v if isinstance(v, bytes) else v.encode()
            headers.append((key.encode(), base64.b64encode(raw).rstrip(b"=") if key.endswith("-bin") else raw))
        self.h2.send_headers(sid, headers)
        call.sid, call._conn = sid, self
        self.calls[sid] = call
        self._flush()
        body = memoryview(_PREFIX.pack(0, len(payload)) + payload)
        while body and not call._ended:
            size = min(len(body), self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size)
            if size <= 0:
                await self._wait_room()
                continue
            self.h2.send_data(sid, body[:size].tobytes(), end_stream=size == len(body))
            body = body[size:]
            self._flush()

    def reset(self, call: Call, code: ErrorCodes) -> None:
        if self.calls.get(call.sid) is call and self.transport is not None:
            try:
                self.h2.reset_stream(call.sid, code)
            except h2.exceptions.H2Error:
                pass  # already closed on the wire
            self._flush()

    def forget(self, call: Call) -> None:
        if self.calls.get(call.sid) is call:
            del self.calls[call.sid]
            self._room.set()
        if self.closing and not self.calls and self.transport is not None:
            self.transport.close()

    # ------------------------------------------------------------------ inside
    def _arrival(self) -> float | None:
        """When this read's bytes had reached the host: the kernel's stamp of its last segment, or the
        loop's floor for the socket (the ``select`` that found them), whichever is later; None when
        neither is known. The stamp is the last segment's: what the kernel merged into one buffer
        while the loop was busy is dated by its latest part (see :class:`Channel`)."""
        stamp = rxstamp.arrived_ms(self.stamped)
        watch = loopwait.watch_of()
        floor = watch.peek(self.fd) if watch is not None and self.fd is not None else None
        known = [t for t in (stamp, floor) if t is not None]
        return max(known) if known else None

    def _event(self, ev: h2.events.Event, at: float | None) -> None:
        if isinstance(ev, h2.events.DataReceived):
            if ev.flow_controlled_length:
                self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            call = self.calls.get(ev.stream_id)
            if call is not None and ev.data:
                call._data(ev.data, at)
            if call is not None and ev.stream_ended is not None:
                call._finish(at)
        elif isinstance(ev, h2.events.ResponseReceived | h2.events.TrailersReceived):
            call = self.calls.get(ev.stream_id)
            if call is not None:
                call._headers(list(ev.headers), at, ev.stream_ended is not None)
        elif isinstance(ev, h2.events.StreamReset):
            call = self.calls.get(ev.stream_id)
            if call is not None:
                code = RST_TO_GRPC.get(ErrorCodes(ev.error_code), grpc.StatusCode.INTERNAL)
                call._end(at, _error(code, f"Received RST_STREAM with error code {int(ev.error_code)}"))
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self._goaway(ev.last_stream_id or 0, int(ev.error_code or 0), at)
        elif isinstance(ev, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._room.set()

    def _goaway(self, last_sid: int, code: int, at: float | None) -> None:
        """The upstream takes no new streams: those it did not process fail UNAVAILABLE (never sent on:
        safe to retry); the others finish; the connection closes after them."""
        self.closing = True
        self._lost = f"GOAWAY received (error code {code})"
        for sid, call in list(self.calls.items()):
            if sid > last_sid:
                call._end(at, _error(grpc.StatusCode.UNAVAILABLE, f"{self._lost}: stream not processed"))
        self._room.set()
        if not self.calls and self.transport is not None:
            self.transport.close()

    def _lose(self, why: str) -> None:
        self.closing = True
        self._lost = why
        for call in list(self.calls.values()):
            call._end(None, _error(grpc.StatusCode.UNAVAILABLE, why))
        self._room.set()
        if self.transport is not None:
            self.transport.close()

    async def _wait_room(self) -> None:
        self._room.clear()
        await self._room.wait()

    def _flush(self) -> None:
        out = self.h2.data_to_send()
        if out and self.transport is not None:
            self.transport.write(out)


class Channel:
    """Calls to one upstream (``HOST:PORT``) over a pool of up to ``pool_size`` HTTP/2 connections,
    opened as calls need them and again after one was lost or went away.

    A call takes a connection that carries no other call, while there is one or the pool may grow;
    past ``pool_size`` calls share the least busy. Not one connection for all, as gRPC's own channel
    does: when the gateway's loop is busy, the answers that pile up in a connection's receive queue
    are merged by the kernel into one buffer stamped with the *latest* arrival (TCP's receive
    coalescing), so on a multiplexed connection at c=32 an answer read late carried a later call's
    stamp (the packets put its end 4.6 ms earlier on average, 11.5 at the p90). One call per
    connection keeps each call's end stamped with its own last bytes."""

    def __init__(self, target: str, tls: TlsFiles | None = None, pool_size: int = POOL_SIZE) -> None:
        self.target = target
        self.tls = tls
        self.pool_size = max(1, pool_size)
        self._conns: list[_Connection] = []
        self._opening = 0  # connections being made

    async def call(self, path: str, payload: bytes, timeout: float | None, metadata: Metadata = ()) -> Call:
        """Start a call (its request sent); a connection that cannot be made ends it at once with
        UNAVAILABLE ``failed to connect ...`` (:meth:`Call.failure`), so the caller may try another
        upstream. The deadline counts from here: a connection still being made when it passes ends the
        call with DEADLINE_EXCEEDED, and the call gets what is left of it."""
        call = Call()
        loop = asyncio.get_running_loop()
        start = loop.time()
        # a connection at hand is taken now, not in a task of its own: asyncio.wait_for runs its
        # coroutine as a task, which starts only after every callback the loop already had (at c=32,
        # 32-token streams: the request's first packet left a median 11.8 ms, p90 36 ms, after the call
        # began, booked as the link's), and two calls could both take the same free connection
        conn = self._at_hand()
        try:
            if conn is None:
                conn = await asyncio.wait_for(self._open(), timeout)
        except grpc.aio.AioRpcError as err:
            call._end(None, err)
            return call
        except TimeoutError:
            call._end(None, _error(grpc.StatusCode.DEADLINE_EXCEEDED, f"Deadline Exceeded connecting to {self.target}"))
            return call
        if timeout is not None:
            timeout = max(timeout - (loop.time() - start), 0.001)
            expire = lambda: call._fail(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")  # noqa: E731
            call._expiry = loop.call_later(timeout, expire)
        try:
            await conn.start(call, path, payload, metadata, timeout)
        except BaseException:
            call.cancel()
            raise
        return call

    async def close(self) -> None:
        for conn in self._conns:
            if conn.transport is not None:
                conn.transport.close()
        self._conns = []

    @property
    def connections(self) -> int:
        """The connections open now."""
        return sum(1 for c in self._conns if not c.closing)

    def _at_hand(self) -> _Connection | None:
        """A connection with no call, else (the pool full) the least busy; None: one must be opened."""
        self._conns = [c for c in self._conns if not c.closing]
        free = next((c for c in self._conns if not c.calls), None)
        if free is not None:
            return free
        if self._conns and len(self._conns) + self._opening >= self.pool_size:
            return min(self._conns, key=lambda c: len(c.calls))
        return None

    async def _open(self) -> _Connection:
        self._opening += 1
        try:
            conn = await self._connect()
        finally:
            self._opening -= 1
        self._conns.append(conn)
        return conn

    async def _connect(self) -> _Connection:
        host, port = host_and_port(self.target)
        loop = asyncio.get_running_loop()
        context = self.tls.client_context(alpn=("h2",)) if self.tls is not None else None
        name = (self.tls.server_name or host) if self.tls is not None else None
        conn = _Connection(self.target, "https" if context else "http")
        try:
            await loop.create_connection(lambda: conn, host, port, ssl=context, server_hostname=name)
        except OSError as exc:
            why = os.strerror(exc.errno) if exc.errno and not isinstance(exc, ssl.SSLError) else str(exc)
            raise _error(grpc.StatusCode.UNAVAILABLE, f"failed to connect to {self.target}: {why}") from None
        return conn


def wait_ms(call: Call, since: float, t: float) -> float | None:
    """How long the end of ``call`` (its last bytes) sat in the host while the gateway's loop was busy,
    before the coroutine that awaited it resumed at ``t`` (``gw.upwait``), counted from ``since`` at the
    earliest (the call's start, or the end of the gateway's work on the chunk before); None when the
    end's arrival is not known."""
    if call.ended_ms is None:
        return None
    return max(0.0, t - max(call.ended_ms, since))


__all__ = ["Call", "Channel", "wait_ms"]
