"""A lean HTTP/1.1 client: one keep-alive connection, the request head's fixed lines built once,
the response parsed by llhttp (``httptools``, the parser under uvicorn).

The load generator's HTTP users spend most of their CPU in the HTTP client, not in the
accounting: geventhttpclient merges and validates every header twice per request, parses the
response through a Python callback per header and starts a timeout object per wait, about
60 µs per request in a 16-user Locust process, where this client needs about half of that
(``bench/loadgen_bench.py``: ``bare-raw`` vs ``bare-http1``). It does what the targets need and
no more: ``POST``/``GET`` with a body of known length, a response read whole (``read``) or
line by line (``readline``, for SSE and JSON lines; chunked bodies are decoded by the parser),
case-insensitive header lookup (``get``: a repeated header gives a list), TLS, one retry on a
fresh connection when a reused idle one turns out closed, and the TCP connect of every new
connection timed (``on_connect``: the network floor of :mod:`pathprobe.loadgen.nullrtt`).

Sockets come from :mod:`socket` / :mod:`ssl` at call time, so under Locust (gevent's monkey
patching) every wait is cooperative, and in a plain threaded program it blocks its thread.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Mapping

import httptools
from pathprobe import rxstamp

pc = time.perf_counter_ns
#: bytes asked of the kernel per receive
RECV_BYTES = 65536
USER_AGENT = "pathprobe-loadgen"


class HttpError(OSError):
    """A response that is not HTTP/1.1, or a connection that closed before its end."""


def _check_header(name: str, value: str) -> None:
    if not name or any(c in name for c in " \t\r\n:") or "\r" in value or "\n" in value:
        raise ValueError(f"invalid HTTP header {name!r}: {value!r}")


def header_lines(headers: Mapping[str, str]) -> bytes:
    """``Name: value\\r\\n`` lines (checked: no line breaks, no bad names), latin-1 like the wire."""
    out = []
    for name, value in headers.items():
        _check_header(name, value)
        out.append(f"{name}: {value}\r\n")
    return "".join(out).encode("latin-1")


class Response:
    """One response on a :class:`Connection`: status and headers parsed, the body read on demand."""

    __slots__ = ("_body", "_conn", "_done", "_keep_alive", "_parser", "_until_close", "headers", "status_code")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.headers: dict[str, str | list[str]] = {}
        self._body = bytearray()
        self._done = False
        self._keep_alive = False
        self._until_close = False  # a body that the connection's end delimits
        self._parser = httptools.HttpResponseParser(self)
        self.status_code = 0

    # -- httptools callbacks -----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        val = value.decode("latin-1")
        old = self.headers.get(key)
        if old is None:
            self.headers[key] = val
        elif isinstance(old, list):
            old.append(val)
        else:
            self.headers[key] = [old, val]

    def on_headers_complete(self) -> None:
        self.status_code = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()  # known here, not after the message
        te = self.headers.get("transfer-encoding", "")
        self._until_close = (
            "content-length" not in self.headers
            and "chunked" not in (te if isinstance(te, str) else ",".join(te)).lower()
            and self.status_code not in (204, 304)
            and self.status_code >= 200
        )

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self._done = True

    # -- reading -----------------------------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise HttpError(f"bad HTTP response: {exc}") from None

    def _more(self) -> bool:
        """Receive once and parse; False at the end of the message."""
        if self._done:
            return False
        data = self._conn.recv()
        if not data:
            self._conn.close()
            if self._until_close:  # a body delimited by the connection's end ends here
                self._done = True
                return False
            raise HttpError("connection closed before the end of the response")
        self._feed(data)
        if self._done:
            self._conn.finished(self._keep_alive)
        return True

    def _read_head(self) -> bool:
        """Parse until the status line and headers are in; False when the connection closed
        before the first byte (an idle keep-alive connection the server had closed)."""
        first = True
        while not self.status_code:
            data = self._conn.recv()
            if not data:
                if first:
                    return False
                self._conn.close()
                raise HttpError("connection closed inside the response head")
            first = False
            self._feed(data)
        if self._done:
            self._conn.finished(self._keep_alive)
        return True

    def get(self, name: str, default: str | list[str] | None = None) -> str | list[str] | None:
        """A header's value, by name in any case (a list when the header was repeated)."""
        return self.headers.get(name.lower(), default)

    def read(self) -> bytes:
        """The rest of the body (all of it, unless ``readline`` took some)."""
        while self._more():
            pass
        out = bytes(self._body)
        self._body.clear()
        return out

    def readline(self, sep: bytes = b"\n") -> bytes:
        """The body up to and including the next ``sep``; the rest of the body at its end."""
        start = 0
        while True:
            i = self._body.find(sep, start)
            if i >= 0:
                line = bytes(self._body[: i + len(sep)])
                del self._body[: i + len(sep)]
                return line
            start = max(0, len(self._body) - len(sep) + 1)
            if not self._more():
                line = bytes(self._body)
                self._body.clear()
                return line


class Connection:
    """One keep-alive HTTP/1.1 connection to ``host:port`` (opened on first use, reopened when
    the server closes it); one request at a time.

    ``headers``: sent with every request (after ``Host`` and ``User-Agent``); a request's own
    ``headers`` follow them. ``on_connect``: called with each new connection's TCP connect time
    in ms (the kernel's handshake, one round trip; TLS's handshake is not in it).
    """

    def __init__(
        self,
        host: str,
        port: int,
        timeout_s: float = 60.0,
        headers: Mapping[str, str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        on_connect: Callable[[float], None] | None = None,
    ) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname or host
        self.on_connect = on_connect
        default_port = 443 if ssl_context is not None else 80
        authority = f"[{host}]" if ":" in host else host
        if port != default_port:
            authority += f":{port}"
        self._fixed = header_lines({"Host": authority, "User-Agent": USER_AGENT, **(headers or {})})
        self._sock: socket.socket | None = None
        self._addr: tuple[int, tuple[object, ...]] | None = None
        self._idle = False  # the socket finished a response and may be reused
        #: the socket's reads, stamped by the kernel (not TLS): the last one's return and arrival
        self.reads = rxstamp.Reads()

    # -- the socket --------------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        if self._addr is None:
            info = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
            self._addr = (info[0], info[4])
        family, addr = self._addr
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t0 = pc()
            sock.connect(addr)
            ms = (pc() - t0) / 1e6
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.server_hostname)
        except BaseException:
            sock.close()
            raise
        self.reads.start(sock, self.ssl_context is None)
        if self.on_connect is not None:
            self.on_connect(ms)
        return sock

    def recv(self) -> bytes:
        assert self._sock is not None
        return self.reads.recv(self._sock, RECV_BYTES)

    def finished(self, keep_alive: bool) -> None:
        """The response in flight is complete: keep the socket for the next request, or close it."""
        if keep_alive:
            self._idle = True
        else:
            self.close()

    def close(self) -> None:
        sock, self._sock, self._idle = self._sock, None, False
        if sock is not None:
            sock.close()

    # -- requests ----------------------------------------------------------------------------
    def request(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | bytes | None = None
    ) -> Response:
        """Send one request and read the response's head; the body is read from the response.

        ``headers``: a mapping, or lines already made by :func:`header_lines` (a target's fixed
        ones, made once)."""
        head = f"{method} {path} HTTP/1.1\r\n".encode("latin-1") + self._fixed
        if headers:
            head += headers if isinstance(headers, bytes) else header_lines(headers)
        if body or method in ("POST", "PUT", "PATCH"):
            head += b"Content-Length: %d\r\n" % len(body)
        data = head + b"\r\n" + body
        self.reads.forget()
        for attempt in (0, 1):
            sock = self._sock
            reused = sock is not None and self._idle
            if sock is None or not reused:
                self.close()  # a response left unread, or none yet
                sock = self._sock = self._connect()
            self._idle = False
            try:
                sock.sendall(data)
                resp = Response(self)
                if resp._read_head():
                    return resp
            except (ConnectionResetError, BrokenPipeError):
                if not reused or attempt:
                    self.close()
                    raise
            # the server had closed the idle connection: once more on a new one
            self.close()
        raise HttpError("connection closed before the response")

    def post(self, path: str, body: bytes = b"", headers: Mapping[str, str] | bytes | None = None) -> Response:
        return self.request("POST", path, body, headers)

    def get(self, path: str, headers: Mapping[str, str] | bytes | None = None) -> Response:
        return self.request("GET", path, b"", headers)
