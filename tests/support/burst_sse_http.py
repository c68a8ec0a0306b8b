"""An HTTP/1.1 upstream for pathprobe's routes whose stream comes all at once: it answers any POST with
``--events`` SSE events (each its own HTTP chunk and its own write, as our server's), the ``[DONE]`` and
the body's end written with the last, all in one turn of its loop, so a gateway relaying them is
behind from the start. The last event carries
the upstream's timing (``srv.total``: from the request's arrival to that write). Plain asyncio, no
engine, no keep-alive pool of its own: one answer per request, connections kept open.

    python -m tests.support.burst_sse_http --port N --events 3000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from tests.support.clients import content_length

#: what each event says (a token of text, as a completion chunk)
_TEXT = " tok"


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(obj: dict[str, object]) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def events_before_last(events: int, emit_ms: float) -> list[bytes]:
    """The first ``events - 1`` chunks (built once: the answer then costs only its last event's build)."""
    return [_event({"text": _TEXT, "token_ids": [i], "emit_ms": emit_ms}) for i in range(events - 1)]


def last_events(events: int, total_ms: float) -> bytes:
    """The last chunk, with its finish reason and ``srv.total``, then ``[DONE]`` and the body's end."""
    last = {"text": _TEXT, "token_ids": [events - 1], "finish_reason": "length", "emit_ms": round(total_ms, 3)}
    last["server_timing"] = f"srv.total;dur={total_ms:.3f}"
    return _event(last) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


class _Upstream(asyncio.Protocol):
    def __init__(self, events: int, before: list[bytes]) -> None:
        self.events, self.before = events, before
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.t0 = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.buf:
            self.t0 = time.perf_counter()
        self.buf += data
        head, sep, rest = self.buf.partition(b"\r\n\r\n")
        if not sep:
            return
        length = content_length(head)
        if len(rest) < length:
            return
        self.buf = rest[length:]
        tr = self.transport
        assert tr is not None
        # each event a write of its own, as our server's (a segment each while the socket takes them),
        # in one turn of the loop: the events were ready (their emit offset: 0.001)
        tr.write(_HEAD)
        for event in self.before:
            tr.write(event)
        total_ms = (time.perf_counter() - self.t0) * 1e3  # the last event handed over: its last timestamp
        tr.write(last_events(self.events, total_ms))


async def _serve(port: int, events: int) -> None:
    before = events_before_last(events, 0.001)
    server = await asyncio.get_running_loop().create_server(lambda: _Upstream(events, before), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--events", type=int, default=3000)
    args = ap.parse_args()
    asyncio.run(_serve(args.port, args.events))


if __name__ == "__main__":
    main()
