"""Transport round trips measured without the application, for the network estimate.

A link whose far end reports nothing about its own time cannot be split: what it holds is
network plus that component's work. What can be measured apart is a round trip the
application takes no part in: the kernel's TCP handshake (HTTP/1.1), or an HTTP/2 PING,
which the peer's HTTP/2 stack answers without the application (gRPC, h2). Each function
returns the shortest of ``n`` tries (ms), or None when the peer cannot be reached; the
shortest, because a round trip can only be stretched by a busy scheduler, never shortened.
"""

from __future__ import annotations

import socket
import time

DEFAULT_TRIES = 3


def _ms(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


def tcp_handshake_ms(host: str, port: int, n: int = DEFAULT_TRIES, timeout: float = 2.0) -> float | None:
    """Shortest of ``n`` TCP connects (connect, then close: nothing is sent)."""
    best: float | None = None
    for _ in range(n):
        try:
            t0 = time.perf_counter_ns()
            with socket.create_connection((host, port), timeout=timeout):
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
