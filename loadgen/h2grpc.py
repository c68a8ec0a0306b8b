"""gRPC over one HTTP/2 connection, for a load generator: one call at a time, no threads.

A Locust user makes one call at a time, so its channel needs no multiplexing, no completion
queue and no thread hand-offs: this client writes the request's HEADERS and DATA frames in one
``sendall`` and reads frames until the trailers, on a plain socket (cooperative under gevent,
which Locust installs). Header blocks are sent as HPACK literals without indexing (the
constant part built once per method) and the server's blocks are read with
:class:`pathprobe.h2frames.BlockReader`, which keeps the HPACK table in step and returns only
``:status``, ``grpc-status``, ``grpc-message`` and every ``server-timing`` value. Compared with
grpcio under gevent it costs a fraction of the CPU per call (see docs/results) and gives the
same outcome: status names, details, trailers, messages and their arrival times.

Covered: flow control both ways (large requests wait for WINDOW_UPDATE; the receive window is
opened wide at the start and topped up), PING and SETTINGS acknowledgements, GOAWAY (the
next call reconnects), RST_STREAM and HTTP statuses mapped to gRPC codes as gRPC's HTTP
mapping says, deadlines (``grpc-timeout`` sent; the client gives up at the deadline, resets
the stream and reports DEADLINE_EXCEEDED). Not covered: TLS, compression (the client asks
for ``identity``), server push (disabled in the SETTINGS).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

from hpack.exceptions import HPACKError
from pathprobe import grpcwait, rxstamp
from pathprobe.deadline import parse_timeout
from pathprobe.h2frames import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PREFACE,
    RST_STREAM,
    S_ENABLE_PUSH,
    S_INITIAL_WINDOW_SIZE,
    S_MAX_FRAME_SIZE,
    SETTINGS,
    WINDOW_UPDATE,
    BlockReader,
    fragment,
    frame,
    frames,
    literal,
)

STATUS_NAMES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
#: gRPC's HTTP-to-gRPC status mapping, for answers without ``grpc-status``
HTTP_TO_GRPC = {400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 502: 14, 503: 14, 504: 14}
#: RST_STREAM error code -> gRPC status (gRPC's PROTOCOL-HTTP2 mapping); others INTERNAL
RST_TO_GRPC = {7: 14, 8: 1, 11: 8, 12: 7}
WANTED = frozenset((b":status", b"grpc-status", b"grpc-message", b"server-timing"))
BIG_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65535


@dataclass(slots=True)
class CallResult:
    code: int  # gRPC status code
    details: str = ""
    server_timing: list[str] = field(default_factory=list)  # every server-timing value of the trailers
    #: server-timing values of the response headers (proxies that cannot touch trailers: HAProxy, Caddy)
    header_timing: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return STATUS_NAMES[self.code] if 0 <= self.code < len(STATUS_NAMES) else "UNKNOWN"


class Channel:
    """One HTTP/2 connection to ``host:port`` carrying one gRPC call at a time."""

    def __init__(self, address: str, user_agent: str = "pathprobe-h2grpc") -> None:
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.authority = address.encode()
        self.user_agent = user_agent.encode()
        self.sock: socket.socket | None = None
        self._blocks: dict[bytes, bytes] = {}
        #: the socket's reads, stamped by the kernel: the last one's return and arrival
        self.reads = rxstamp.Reads()

    # ------------------------------------------------------------------ connection
    def _connect(self, timeout: float) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=max(timeout, 0.001))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = b"".join(
            k.to_bytes(2, "big") + v.to_bytes(4, "big")
            for k, v in ((S_ENABLE_PUSH, 0), (S_INITIAL_WINDOW_SIZE, BIG_WINDOW))
        )
        sock.sendall(
            PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, (BIG_WINDOW - DEFAULT_WINDOW).to_bytes(4, "big"))
        )
        self.sock = sock
        self.reads.start(sock)
        self.buf = bytearray()
        self.reader = BlockReader()
        self.next_sid = 1
        self.peer_window = DEFAULT_WINDOW  # connection-level send window
        self.peer_initial = DEFAULT_WINDOW  # the server's SETTINGS_INITIAL_WINDOW_SIZE
        self.peer_max_frame = 16384
        self.recv_unacked = 0
        self.goaway_sid: int | None = None
        return sock

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def _block(self, path: bytes) -> bytes:
        """The constant part of a request's header block (HPACK literals: no table on either side)."""
        b = self._blocks.get(path)
        if b is None:
            # :method POST and :scheme http are static-table entries 3 and 6
            b = self._blocks[path] = (
                b"\x83\x86"
                + literal(b":path", path)
                + literal(b":authority", self.authority)
                + literal(b"content-type", b"application/grpc")
                + literal(b"te", b"trailers")
                + literal(b"grpc-accept-encoding", b"identity")
                + literal(b"user-agent", self.user_agent)
            )
        return b

    # ------------------------------------------------------------------ one call
    def call(
        self,
        path: str,
        message: bytes,
        timeout_s: float,
        metadata: Sequence[tuple[str, str]] | None,
        on_message: Callable[[bytes, int], None],
    ) -> CallResult:
        """Send one request message; ``on_message(bytes, arrival perf_counter_ns)`` per response message."""
        deadline = time.monotonic() + timeout_s
        self.reads.forget()
        try:
            sock = self.sock if self.sock is not None else self._connect(timeout_s)
        except OSError as exc:
            return CallResult(14, f"failed to connect to {self.host}:{self.port}: {exc.strerror or exc}")
        sid = self.next_sid
        self.next_sid += 2
        sent = _timeout(timeout_s)
        block = self._block(path.encode()) + literal(b"grpc-timeout", sent)
        # the deadline as sent (exact): the server measures how long it held the call (pathprobe.grpcwait)
        block += literal(grpcwait.METADATA_KEY.encode(), _millis(sent))
        for k, v in metadata or ():
            block += literal(k.encode(), v.encode())
        body = b"\x00" + len(message).to_bytes(4, "big") + message
        call = _Call(sid, self.peer_initial, on_message)
        try:
            self._send(sock, sid, block, body, call, deadline)
            while call.result is None:
                self._recv(sock, call, deadline)
        except TimeoutError:
            self._reset(sid, 8)
            return CallResult(4, "Deadline Exceeded")
        except (OSError, HPACKError, ConnectionError) as exc:
            self.close()
            why = "connection closed by the server" if isinstance(exc, ConnectionError) and not str(exc) else str(exc)
            return CallResult(14, f"{self.host}:{self.port}: {why}")
        if self.goaway_sid is not None:  # finish this call, then a new connection for the next
            self.close()
        return call.result

    def _send(self, sock: socket.socket, sid: int, block: bytes, body: bytes, call: _Call, deadline: float) -> None:
        head = frame(HEADERS, END_HEADERS, sid, block)
        limit = min(self.peer_max_frame, self.peer_window, call.send_window)
        if len(body) <= limit:  # the usual case: one write for the whole request
            sock.sendall(head + frame(DATA, END_STREAM, sid, body))
            self.peer_window -= len(body)
            call.send_window -= len(body)
            return
        sock.sendall(head)
        pos = 0
        while True:
            n = min(len(body) - pos, self.peer_max_frame, self.peer_window, call.send_window)
            if n <= 0:  # wait for WINDOW_UPDATE (answers may arrive meanwhile)
                self._recv(sock, call, deadline)
                if call.result is not None:
                    return
                continue
            last = pos + n >= len(body)
            sock.sendall(frame(DATA, END_STREAM if last else 0, sid, body[pos : pos + n]))
            self.peer_window -= n
            call.send_window -= n
            pos += n
            if last:
                return

    def _reset(self, sid: int, code: int) -> None:
        if self.sock is not None:
            try:
                self.sock.sendall(frame(RST_STREAM, 0, sid, code.to_bytes(4, "big")))
            except OSError:
                self.close()

    def _recv(self, sock: socket.socket, call: _Call, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        # TimeoutError (socket.timeout, gevent's too) at the deadline
        data = self.reads.recv(sock, 262144)
        t = self.reads.read_at
        if not data:
            raise ConnectionError("")
        buf = self.buf
        buf += data
        out: list[bytes] = []
        end = 0
        for start, end, ftype, flags, fsid in frames(buf):
            if ftype == DATA:
                length = end - start - 9
                self.recv_unacked += length
                if fsid == call.sid:
                    body = bytes(buf[start + 9 : end])
                    if flags & PADDED:
                        body = body[1 : len(body) - body[0]]
                    call.data(body, t)
                    if flags & END_STREAM and call.result is None:
                        call.result = CallResult(13, "the server ended the stream without trailers")
            elif ftype in (HEADERS, CONTINUATION):
                payload = bytes(buf[start + 9 : end])
                if ftype == HEADERS:
                    call.hdr = (fsid, flags, bytearray(fragment(flags, payload)[1]))
                elif call.hdr is not None:
                    call.hdr[2].extend(payload)
                if flags & END_HEADERS and call.hdr is not None:
                    hsid, hflags, hblock = call.hdr
                    call.hdr = None
                    pairs = self.reader.read_pairs(bytes(hblock), WANTED)  # every block: keeps the table in step
                    if hsid == call.sid:
                        call.headers(pairs, bool(hflags & END_STREAM))
            elif ftype == SETTINGS:
                if not flags & 1:
                    self._settings(bytes(buf[start + 9 : end]), call)
                    out.append(frame(SETTINGS, 1, 0, b""))
            elif ftype == PING:
                if not flags & 1:
                    out.append(frame(PING, 1, 0, bytes(buf[start + 9 : end])))
            elif ftype == WINDOW_UPDATE:
                inc = int.from_bytes(buf[start + 9 : start + 13], "big") & 0x7FFFFFFF
                if fsid == 0:
                    self.peer_window += inc
                elif fsid == call.sid:
                    call.send_window += inc
            elif ftype == RST_STREAM and fsid == call.sid and call.result is None:
                code = int.from_bytes(buf[start + 9 : start + 13], "big")
                call.result = CallResult(RST_TO_GRPC.get(code, 13), f"Received RST_STREAM with error code {code}")
            elif ftype == GOAWAY:
                self.goaway_sid = int.from_bytes(buf[start + 9 : start + 13], "big") & 0x7FFFFFFF
                if call.sid > self.goaway_sid and call.result is None:
                    call.result = CallResult(14, "the server sent GOAWAY before this call")
        del buf[:end]
        if self.recv_unacked > (1 << 30):  # top the connection window up again
            out.append(frame(WINDOW_UPDATE, 0, 0, self.recv_unacked.to_bytes(4, "big")))
            self.recv_unacked = 0
        if out:
            sock.sendall(b"".join(out))

    def _settings(self, payload: bytes, call: _Call) -> None:
        for i in range(0, len(payload) - 5, 6):
            key, value = int.from_bytes(payload[i : i + 2], "big"), int.from_bytes(payload[i + 2 : i + 6], "big")
            if key == S_INITIAL_WINDOW_SIZE:
                call.send_window += value - self.peer_initial
                self.peer_initial = value
            elif key == S_MAX_FRAME_SIZE:
                self.peer_max_frame = value


class _Call:
    __slots__ = (
        "got_headers",
        "hdr",
        "header_timing",
        "http_status",
        "msgbuf",
        "on_message",
        "result",
        "send_window",
        "sid",
    )

    def __init__(self, sid: int, send_window: int, on_message: Callable[[bytes, int], None]) -> None:
        self.sid = sid
        self.send_window = send_window
        self.on_message = on_message
        self.msgbuf = b""
        self.hdr: tuple[int, int, bytearray] | None = None
        self.got_headers = False
        self.http_status = 0
        self.header_timing: list[str] = []
        self.result: CallResult | None = None

    def data(self, payload: bytes, t: int) -> None:
        buf = self.msgbuf + payload if self.msgbuf else payload
        pos, n = 0, len(buf)
        while n - pos >= 5:
            size = int.from_bytes(buf[pos + 1 : pos + 5], "big")
            if n - pos - 5 < size:
                break
            if buf[pos]:
                self.result = CallResult(13, "compressed message received; this client asks for identity")
                return
            self.on_message(buf[pos + 5 : pos + 5 + size], t)
            pos += 5 + size
        self.msgbuf = buf[pos:]

    def headers(self, pairs: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        if not self.got_headers:
            self.got_headers = True
            for k, v in pairs:
                if k == b":status":
                    self.http_status = int(v)
                elif k == b"server-timing" and not end_stream:
                    self.header_timing.append(v.decode(errors="replace"))
        if not end_stream:
            return
        code, details, timing = None, "", []
        for k, v in pairs:
            if k == b"grpc-status":
                code = int(v)
            elif k == b"grpc-message":
                details = unquote(v.decode(errors="replace"))
            elif k == b"server-timing":
                timing.append(v.decode(errors="replace"))
        if code is None:  # no gRPC status: the HTTP status says what happened
            code = HTTP_TO_GRPC.get(self.http_status, 2) if self.http_status != 200 else 13
            details = details or f"Received http2 header with status: {self.http_status}"
        elif self.msgbuf:
            code, details = 13, "the stream ended inside a message"
        self.result = CallResult(code, details, timing, self.header_timing)


def _millis(grpc_timeout: bytes) -> bytes:
    """A ``grpc-timeout`` value in ms (as :data:`pathprobe.grpcwait.METADATA_KEY` declares it)."""
    return f"{(parse_timeout(grpc_timeout.decode()) or 0.0) * 1000.0:.3f}".encode()


def _timeout(seconds: float) -> bytes:
    """``grpc-timeout`` value: at most 8 digits, in the finest unit that fits."""
    for unit, scale in (("u", 1e6), ("m", 1e3), ("S", 1), ("M", 1 / 60), ("H", 1 / 3600)):
        v = int(seconds * scale)
        if v < 100_000_000:
            return f"{max(v, 1)}{unit}".encode()
    return b"99999999H"
