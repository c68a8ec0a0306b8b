"""A stream's end leaves our server in one write: the last event (with the server's timing), the usage
chunk where asked for, and ``[DONE]``. Written apart, the server's loop could take a turn between them
(at c=32 its other requests' work), so the stream's bytes would end after the server's last timestamp
and its consumer (a gateway, the client) could not tell that lateness from its own. Each write of an
aiohttp chunked response is one chunk of the HTTP/1.1 framing, so the framing shows the writes.
Real process: the synthetic-engine server."""

from __future__ import annotations

import json
import socket

import pytest


def _chunks(port: int, path: str, body: dict) -> list[bytes]:
    """The response's chunks as the server framed them (HTTP/1.1 chunked transfer coding)."""
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + data)
        raw = b""
        while part := sock.recv(65536):
            raw += part
    headers, _, rest = raw.partition(b"\r\n\r\n")
    assert headers.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in headers.lower(), headers
    out = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out.append(rest[:size])
        rest = rest[size + 2 :]


def _events(chunk: bytes) -> list[dict | str]:
    out: list[dict | str] = []
    for ev in chunk.split(b"\n\n"):
        if ev.startswith(b"data: "):
            payload = ev[6:]
            out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


@pytest.mark.parametrize(
    ("path", "body", "last_keys"),
    [
        ("/v1/completions", {"prompt": "hello there", "max_tokens": 6, "stream": True}, ["choices"]),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": 6,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            ["choices", "usage"],
        ),
        ("/v1/generate", {"prompt": "hello there", "max_tokens": 6, "stream": True}, ["finish_reason"]),
    ],
    ids=["completions", "chat-usage", "native"],
)
def test_the_last_events_and_done_go_out_in_one_write(synthetic_server, path, body, last_keys) -> None:
    chunks = _chunks(synthetic_server.http_port, path, body)
    events = [_events(c) for c in chunks]
    assert all(events), chunks  # every write carries whole events
    tail = events[-1]
    # the final write: the finish chunk (and the usage chunk), with the server's timing, then [DONE]
    assert tail[-1] == "[DONE]" and len(tail) == len(last_keys) + 1, tail
    finish = tail[0]
    assert isinstance(finish, dict)
    reason = finish["choices"][0]["finish_reason"] if "choices" in finish else finish["finish_reason"]
    assert reason == "length"
    assert "server_timing" in tail[-2]  # the server's timing rides the write that ends the stream
    for ev, key in zip(tail, last_keys, strict=False):
        assert isinstance(ev, dict) and key in ev
    # the events before it went out as they came, one write each
    assert len(chunks) >= 6 and all(len(e) == 1 for e in events[:-1]), events
