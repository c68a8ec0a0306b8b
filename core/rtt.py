"""Round trips measured apart from a request, for the network estimate of a silent link.

A link whose far end reports nothing about its own time cannot be split: what it holds is
network plus that component's work. What can be measured apart is a round trip the model
takes no part in. Three kinds, each named by a constant (a record's ``network_estimate_kind``):

- :data:`HTTP_NULL`: a cheap request the server answers without model work (``GET /v1/models``),
  sent by the load generator's own HTTP client on the connection it uses for the requests; the
  median of recent ones (:class:`RoundTrips`). Like the network figure of a server that reports
  its total, it holds both HTTP stacks' time outside the server's handler: the like-for-like
  estimate.
- :data:`TCP_HANDSHAKE`: the kernel's TCP handshake (HTTP/1.1); the shortest of ``n``: a floor.
- :data:`H2_PING`: an HTTP/2 PING, answered by the peer's HTTP/2 stack without the application
  (gRPC, h2); the shortest of ``n``: a floor.

The handshake and PING functions return the shortest of ``n`` tries (ms), or None when the
peer cannot be reached; the shortest, because a round trip can only be stretched by a busy
scheduler, never shortened.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections import deque

DEFAULT_TRIES = 3
#: estimate kinds (a record's ``network_estimate_kind``; behind a forwarder it is the forwarder's
#: ``<kind>.connect`` entry, e.g. ``gw.connect``: a TCP handshake the gateway timed)
HTTP_NULL = "http-null-rtt"
TCP_HANDSHAKE = "tcp-handshake"
H2_PING = "h2-ping"
#: what each kind is, for the notes under tables
KINDS = {
    HTTP_NULL: "median HTTP null round trip on the load generator's own connection (both HTTP stacks)",
    TCP_HANDSHAKE: "shortest TCP handshake (a floor)",
    H2_PING: "shortest HTTP/2 PING (a floor)",
}


def describe(kind: str) -> str:
    """A kind in words (a forwarder's ``<kind>.connect``: its shortest TCP connect to the silent upstream)."""
    if kind in KINDS:
        return KINDS[kind]
    if kind.endswith(".connect"):
        return f"the forwarder's shortest TCP connect upstream ({kind}, a floor)"
    return kind


class RoundTrips:
    """The most recent round trips (ms) of one kind; the estimate is their median."""

    def __init__(self, keep: int = 64) -> None:
        self.samples: deque[float] = deque(maxlen=keep)

    def add(self, ms: float) -> None:
        self.samples.append(ms)

    def __len__(self) -> int:
        return len(self.samples)

    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None


def _ms(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


def tcp_handshake_ms(host: str, port: int, n: int = DEFAULT_TRIES, timeout: float = 2.0) -> float | None:
    """Shortest of ``n`` TCP connects (connect, then close: nothing is sent). Only the ``connect`` is
    timed: the address is resolved and the socket made before the clock starts. Under gevent (the
    load generator's users) a name lookup goes through a thread pool, which on a busy 2-core machine
    put a handshake's 0.03 ms at 0.1-0.27 ms, above the HTTP null round trip it is the floor of."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)[0]
    except OSError:
        return None
    best: float | None = None
    for _ in range(n):
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout)
                t0 = time.perf_counter_ns()
                sock.connect(addr)
                ms = _ms(t0)
        except OSError:
            return best
        best = ms if best is None else min(best, ms)
    return best


def h2_ping_ms(host: str, port: int, n: int = DEFAULT_TRIES, timeout: float = 2.0) -> float | None:
    """Shortest of ``n`` HTTP/2 PING round trips on one cleartext HTTP/2 connection (prior
    knowledge, as gRPC without TLS speaks); None when the peer does not speak HTTP/2."""
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions

    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    best: float | None = None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        for i in range(n):
            payload = i.to_bytes(8, "big")
            conn.ping(payload)
            t0 = time.perf_counter_ns()
            sock.sendall(conn.data_to_send())
            acked = False
            while not acked:
                data = sock.recv(65536)
                if not data:
                    return best
                for ev in conn.receive_data(data):
                    if isinstance(ev, h2.events.PingAckReceived) and ev.ping_data == payload:
                        acked = True
                pending = conn.data_to_send()  # SETTINGS acks
                if pending:
                    sock.sendall(pending)
            ms = _ms(t0)
            best = ms if best is None else min(best, ms)
        conn.close_connection()
        sock.sendall(conn.data_to_send())
    except (OSError, h2.exceptions.ProtocolError):
        return best
    finally:
        sock.close()
    return best
