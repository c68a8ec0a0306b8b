"""A gRPC upstream for pathprobe's contract whose stream ends late: it answers ``GenerateStream`` with
all of its chunks at once (one write, so a gateway reading them is behind from the start) and sends the
trailers ``--trailer-delay-ms`` after them (a server busy after its last message: grpc.aio's sends its
status in a batch of its own). Plain HTTP/2 on h2; no ``server-timing``, no health service.

    python -m tests.support.late_trailers_grpc --port N --chunks 1500 --trailer-delay-ms 300 [--status 8]
"""

from __future__ import annotations

import argparse
import asyncio
import struct

import h2.config
import h2.connection
import h2.events
from pathprobe.v1 import llm_pb2


def _body(chunks: int, finish: bool = True) -> bytes:
    """``chunks`` gRPC messages, the last one with its finish reason where ``finish``."""
    out = []
    for i in range(chunks):
        last = finish and i == chunks - 1
        msg = llm_pb2.GenerateChunk(text=" tok", token_ids=[i], finish_reason="length" if last else "")
        raw = msg.SerializeToString()
        out.append(struct.pack(">BI", 0, len(raw)) + raw)
    return b"".join(out)


class _Upstream(asyncio.Protocol):
    def __init__(self, body: bytes, delay_s: float, status: int = 0) -> None:
        self.body, self.delay_s, self.status = body, delay_s, status
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.transport: asyncio.Transport | None = None
        self.answers: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.conn.initiate_connection()
        transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        for ev in self.conn.receive_data(data):
            if isinstance(ev, h2.events.DataReceived) and ev.flow_controlled_length:
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                task = asyncio.ensure_future(self._answer(ev.stream_id))
                self.answers.add(task)
                task.add_done_callback(self.answers.discard)
        self._flush()

    def _flush(self) -> None:
        if self.transport is not None:
            self.transport.write(self.conn.data_to_send())

    async def _answer(self, sid: int) -> None:
        self.conn.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
        size = self.conn.max_outbound_frame_size
        assert len(self.body) <= self.conn.local_flow_control_window(sid), "the body must fit the window"
        for i in range(0, len(self.body), size):
            self.conn.send_data(sid, self.body[i : i + size])
        self._flush()  # every chunk in one write
        await asyncio.sleep(self.delay_s)
        trailers = [("grpc-status", str(self.status))]
        if self.status:
            trailers.append(("grpc-message", "late trailers: the stream failed"))
        self.conn.send_headers(sid, trailers, end_stream=True)
        self._flush()


async def _serve(port: int, chunks: int, delay_ms: float, status: int) -> None:
    body = _body(chunks, finish=not status)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Upstream(body, delay_ms / 1000.0, status), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--chunks", type=int, default=1500)
    ap.add_argument("--trailer-delay-ms", type=float, default=300.0)
    ap.add_argument("--status", type=int, default=0, help="the trailers' grpc-status (not 0: the stream fails)")
    cfg = ap.parse_args(argv)
    asyncio.run(_serve(cfg.port, cfg.chunks, cfg.trailer_delay_ms, cfg.status))


if __name__ == "__main__":
    main()
