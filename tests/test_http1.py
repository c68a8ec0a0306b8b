"""The load generator's HTTP/1.1 client (pathprobe.loadgen.http1) against real sockets on
loopback: a scripted server answers exactly as written, so keep-alive, a server closing an idle
connection, chunked and close-delimited bodies and cut-short responses are each checked."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import pytest
from pathprobe.loadgen.http1 import Connection, HttpError, header_lines

from tests.support.clients import content_length


class ScriptedServer:
    """Accepts connections on 127.0.0.1 and answers each request with ``script(connection, its
    index, the request's bytes)``; the connection stays open while the script returns True."""

    def __init__(self, script: Callable[[socket.socket, int, bytes], bool]) -> None:
        self.script = script
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._conn, args=(conn, self.accepted - 1), daemon=True).start()

    def _conn(self, conn: socket.socket, index: int) -> None:
        with conn:
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = content_length(head)
                while len(rest) < length:
                    rest += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + rest[:length])
                buf = rest[length:]
                if not self.script(conn, index, self.requests[-1]):
                    return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve():
    servers: list[ScriptedServer] = []

    def make(script: Callable[[socket.socket, int, bytes], bool]) -> ScriptedServer:
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def test_requests_reuse_one_connection_and_time_its_connect(serve):
    timing = b"Server-Timing: a;dur=1\r\nserver-timing: b;dur=2\r\n"
    srv = serve(lambda c, i, r: c.sendall(ok(b'{"n":1}', timing)) or True)
    connects: list[float] = []
    conn = Connection("127.0.0.1", srv.port, 10, headers={"X-Fixed": "1"}, on_connect=connects.append)
    for _ in range(5):
        resp = conn.post("/v1/generate", b'{"prompt":"hi"}', header_lines({"Content-Type": "application/json"}))
        assert resp.status_code == 200
        assert resp.read() == b'{"n":1}'
        assert resp.get("SERVER-TIMING") == ["a;dur=1", "b;dur=2"]  # any case; a repeated header is a list
    conn.close()
    assert srv.accepted == 1 and len(connects) == 1 and connects[0] > 0
    assert srv.requests[0] == (
        b"POST /v1/generate HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUser-Agent: pathprobe-loadgen\r\nX-Fixed: 1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 15\r\n\r\n"
        b'{"prompt":"hi"}' % srv.port
    )


def test_an_idle_connection_the_server_closed_is_replaced_once(serve):
    # every connection answers one request with keep-alive, then closes
    srv = serve(lambda c, i, r: c.sendall(ok(b"x")) and False)
    conn = Connection("127.0.0.1", srv.port, 10)
    for _ in range(3):
        resp = conn.get("/v1/models")
        assert resp.read() == b"x"
    assert srv.accepted == 3
    assert [r.split(b"\r\n")[0] for r in srv.requests] == [b"GET /v1/models HTTP/1.1"] * 3


def test_chunked_body_line_by_line(serve):
    events = b'data: {"a":1}\n\ndata: {"a":2}\n\ndata: [DONE]\n\n'
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(events[i : i + 7]), events[i : i + 7]) for i in range(0, len(events), 7))

    def script(c: socket.socket, i: int, r: bytes) -> bool:
        c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
        c.sendall(chunks + b"0\r\n\r\n")
        return True

    srv = serve(script)
    conn = Connection("127.0.0.1", srv.port, 10)
    for _ in range(2):
        resp = conn.post("/v1/generate", b"{}")
        lines = []
        while line := resp.readline(b"\n"):
            lines.append(line)
        assert b"".join(lines) == events
        assert lines[0] == b'data: {"a":1}\n' and lines[1] == b"\n"
        assert resp.read() == b""
    assert srv.accepted == 1


def test_a_body_delimited_by_the_connection_end(serve):
    srv = serve(lambda c, i, r: c.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it") and False)
    conn = Connection("127.0.0.1", srv.port, 10)
    assert conn.get("/").read() == b"all of it"
    assert conn.get("/").read() == b"all of it"  # a new connection for the next one
    assert srv.accepted == 2


def test_a_response_cut_short_is_an_error_not_a_short_body(serve):
    srv = serve(lambda c, i, r: c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabcde") and False)
    conn = Connection("127.0.0.1", srv.port, 10)
    resp = conn.get("/")
    with pytest.raises(HttpError, match="closed before the end"):
        resp.read()


def test_no_header_can_break_the_request_head():
    with pytest.raises(ValueError, match="invalid HTTP header"):
        header_lines({"X-A": "1\r\nX-Injected: 2"})
    with pytest.raises(ValueError, match="invalid HTTP header"):
        header_lines({"Bad Name": "1"})


def test_the_native_target_sends_the_same_request_and_reads_the_answer(serve):
    import json

    from pathprobe.deadline import TIMEOUT_HEADER
    from pathprobe.loadgen.call import HANDSHAKE_PROBES
    from pathprobe.loadgen.targets import CallSpec, NativeHttpTarget, Outcome

    answer = json.dumps({"text": " Paris", "token_ids": [1], "usage": {"prompt_tokens": 5, "completion_tokens": 1}})
    srv = serve(lambda c, i, r: c.sendall(ok(answer.encode(), b"Server-Timing: srv.total;dur=0.5\r\n")) or True)
    target = NativeHttpTarget(f"http://127.0.0.1:{srv.port}", 20)
    try:
        for n in range(2):
            out = Outcome()
            spec = CallSpec(prompt="Où est la tour? 🗼", max_tokens=1, stream=False, request_id=f"r{n}")
            target.call(spec, {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"} if n else {}, out)
            assert out.ok and out.tokens_out == 1 and out.tokens_in == 5 and dict(out.entries) == {"srv.total": 0.5}
            assert out.response_bytes == len(answer)
    finally:
        target.close()
    assert srv.accepted == 1 + HANDSHAKE_PROBES  # the handshake probes at start, then one connection
    for n, req in enumerate(srv.requests):
        head, _, body = req.partition(b"\r\n\r\n")
        sent = {
            "prompt": "Où est la tour? 🗼",
            "max_tokens": 1,
            "ignore_eos": True,
            "request_id": f"r{n}",
            "stream": False,
        }
        # the bytes json.dumps gives (compact, UTF-8)
        assert body == json.dumps(sent, separators=(",", ":"), ensure_ascii=False).encode()
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0] == "POST /v1/generate HTTP/1.1"
        assert {"Content-Type: application/json", "Accept: application/json, text/event-stream"} <= set(lines)
        assert any(line.startswith(f"{TIMEOUT_HEADER}: ") for line in lines)
        assert ("traceparent: 00-" + "1" * 32 + "-" + "2" * 16 + "-01" in lines) is (n == 1)


def _chunked(*events: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + body


@pytest.mark.parametrize("done", [True, False])
def test_an_event_stream_without_done_is_a_failure_not_an_ok_record(serve, done):
    """Nothing lost silently: a stream whose body ends (well-formed) before ``data: [DONE]`` was cut
    short somewhere on the path; its record is not ok and says so."""
    from pathprobe.loadgen.http_base import CUT_SHORT
    from pathprobe.loadgen.targets import CallSpec, OpenAITarget, Outcome

    events = [b'data: {"choices": [{"text": " Paris"}]}\n\n']
    if done:
        events.append(b"data: [DONE]\n\n")
    srv = serve(lambda c, i, r: c.sendall(_chunked(*events)) or True)
    target = OpenAITarget(f"http://127.0.0.1:{srv.port}", 20)
    target._model = "m"
    try:
        out = Outcome()
        target.call(CallSpec(prompt="x", max_tokens=1, stream=True, request_id="r"), {}, out)
    finally:
        target.close()
    assert out.tokens_out == 1
    assert out.ok is done
    assert (out.error == CUT_SHORT) is (not done)


def test_each_read_carries_when_its_bytes_arrived_so_a_late_read_is_seen_as_late(serve):
    # the body comes 30 ms after the head; the client reads it 80 ms after the head: the kernel's stamp
    # (pathprobe.rxstamp) says the bytes had waited ~50 ms for it, which the client's wait for
    # its own loop is capped by (a busy stretch or a preemption holds more than the bytes waited)
    def script(c: socket.socket, i: int, r: bytes) -> bool:
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
        time.sleep(0.03)
        c.sendall(b"body")
        return True

    srv = serve(script)
    conn = Connection("127.0.0.1", srv.port, 10)
    for _ in range(2):
        resp = conn.get("/")
        t_head = time.perf_counter_ns()
        time.sleep(0.08)
        assert resp.read() == b"body"
        assert conn.reads.arrived_at is not None and conn.reads.age_ms is not None
        assert 20.0 <= (conn.reads.arrived_at - t_head) / 1e6 <= 60.0  # sent 30 ms after the head
        assert 25.0 <= conn.reads.age_ms <= 80.0  # read ~50 ms after it came
        assert conn.reads.read_at >= conn.reads.arrived_at
