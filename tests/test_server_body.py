"""Ground truth for a server's wait for its request body (``srv.body``): the links' time, never its own.

A raw client sends a request's head, then its body ``LATE_MS`` later (what a 100 KB prompt does behind a
slow link, or behind a proxy that forwards the body as it comes). Both front ends start a request at its
head; the wait for the body must come out as ``srv.body`` and land on the link in the split, and the
server's own time must stay at its size. Without the entry the gRPC server's split put it on the link
already (its request started once the message was in), the HTTP server's in its own "other".
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator

import h2.config
import h2.connection
import h2.events
import pytest
from pathprobe import segments, timing
from pathprobe.v1 import llm_pb2

from tests.support.clients import headers_of, read_answer
from tests.support.procs import Server

LATE_MS = 200.0
#: a request whose body came at once: what the body's read takes when nothing waits (a loop turn)
PROMPT_MS = 10.0


def _recv_until(sock: socket.socket, done: Callable[[], bool]) -> Iterator[bytes]:
    while not done():
        data = sock.recv(65536)
        assert data, "connection closed"
        yield data


def _grpc_call(port: int, late_ms: float) -> tuple[float, timing.Chain]:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    msg = llm_pb2.GenerateRequest(prompt="hello " * 50, max_tokens=4).SerializeToString()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        # without it the body's write waits for the head's ACK (Nagle's algorithm): a delayed ACK, 40 ms,
        # which the server rightly books as its wait for the body
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        head = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/pathprobe.v1.LLM/Generate"),
            (":authority", f"127.0.0.1:{port}"),
            ("te", "trailers"),
            ("content-type", "application/grpc"),
        ]
        t0 = time.perf_counter()
        conn.send_headers(1, head)
        sock.sendall(conn.data_to_send())
        time.sleep(late_ms / 1000.0)
        conn.send_data(1, struct.pack(">BI", 0, len(msg)) + msg, end_stream=True)
        sock.sendall(conn.data_to_send())
        trailers: dict[str, str] = {}
        ended = []
        for data in _recv_until(sock, lambda: bool(ended)):
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.TrailersReceived):
                    trailers = dict(ev.headers)
                if isinstance(ev, h2.events.StreamEnded | h2.events.StreamReset):
                    ended.append(ev)
            sock.sendall(conn.data_to_send())
        e2e = (time.perf_counter() - t0) * 1000.0
    assert trailers.get("grpc-status") == "0", trailers
    return e2e, timing.parse_chain(trailers[timing.METADATA_KEY])


def _http_call(port: int, late_ms: float) -> tuple[float, timing.Chain]:
    body = b'{"prompt": "' + b"hello " * 50 + b'", "max_tokens": 4}'
    head = (
        f"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        sock.sendall(head)
        time.sleep(late_ms / 1000.0)
        sock.sendall(body)
        head, _ = read_answer(sock)
        e2e = (time.perf_counter() - t0) * 1000.0
    assert head.startswith(b"HTTP/1.1 200 "), head
    headers = headers_of(head)
    return e2e, timing.parse_chain(headers[timing.HTTP_HEADER.lower()])


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    srv = Server(tmp_path_factory.mktemp("body"), "--engine", "synthetic")
    yield srv
    srv.stop()


@pytest.mark.parametrize("call", ["grpc", "http"])
def test_a_late_body_is_the_links_time_not_the_servers(server: Server, call: str) -> None:
    port = server.grpc_port if call == "grpc" else server.http_port
    do = _grpc_call if call == "grpc" else _http_call
    do(port, 0.0)  # the connection's and the route's first call
    prompt = [do(port, 0.0) for _ in range(3)]
    late = [do(port, LATE_MS) for _ in range(3)]
    for _, chain in prompt:
        assert chain.hops[0].get("body") < PROMPT_MS, (call, chain)
    for e2e, chain in late:
        s = segments.split(e2e, chain)
        srv = chain.hops[0]
        where = (call, round(e2e, 1), s.links, s.hops, chain)
        # the server waited for the body from its head on: the whole delay, and less than the call took
        assert LATE_MS - 5.0 <= srv.get("body") <= e2e, where
        assert s.links[0] >= LATE_MS - 5.0, where  # on the link ...
        assert 0.0 <= s.hops[0].other < PROMPT_MS, where  # ... not the server's own time
        assert min(s.links) >= 0.0 and s.queueing >= 0.0 and s.other >= 0.0, where
