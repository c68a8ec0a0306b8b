"""Small real clients for tests: gRPC (raw stubs) and HTTP (stdlib), returning timing entries."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import grpc
from pathprobe import timing
from pathprobe.v1 import llm_pb2, llm_pb2_grpc


def grpc_generate(target: str, metadata: tuple = (), timeout: float = 30, **fields: Any):
    """Unary call; returns (response, entries)."""
    with grpc.insecure_channel(target) as ch:
        stub = llm_pb2_grpc.LLMStub(ch)
        resp, call = stub.Generate.with_call(llm_pb2.GenerateRequest(**fields), metadata=metadata, timeout=timeout)
        return resp, timing.from_metadata(call.trailing_metadata())


def grpc_stream(target: str, metadata: tuple = (), timeout: float = 30, offsets: list | None = None, **fields: Any):
    """Streaming call; returns (chunks, entries). ``offsets``, when given, gets each chunk's
    (emit_ms, fwd_ms) before they are cleared."""
    with grpc.insecure_channel(target) as ch:
        stub = llm_pb2_grpc.LLMStub(ch)
        call = stub.GenerateStream(llm_pb2.GenerateRequest(**fields), metadata=metadata, timeout=timeout)
        chunks = list(call)
        for c in chunks:  # when the server emitted it differs call to call (tests/test_stream_chunks.py checks it)
            if offsets is not None:
                offsets.append((c.emit_ms, c.fwd_ms))
            c.ClearField("emit_ms")
            c.ClearField("fwd_ms")  # when a gateway handed it on, likewise
        return chunks, timing.from_metadata(call.trailing_metadata())


def http_post(
    url: str, body: Any, headers: dict[str, str] | None = None, raw: bytes | None = None, timeout: float = 30
) -> tuple[int, Any, bytes]:
    """(status, headers (case-insensitive, as HTTP has them), body)."""
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def sse_events(body: bytes) -> list[Any]:
    """Parse an SSE body into its JSON events (``[DONE]`` kept as the string)."""
    out: list[Any] = []
    for block in body.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def timed_generate(conn: http.client.HTTPConnection, body: bytes) -> tuple[float, str | None]:
    """(e2e ms, the ``Server-Timing`` header) of one native unary ``POST /v1/generate`` on a kept-alive
    connection; the answer must be 200."""
    t0 = time.perf_counter()
    conn.request("POST", "/v1/generate", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    e2e = (time.perf_counter() - t0) * 1000.0
    assert resp.status == 200, resp.status
    return e2e, resp.getheader(timing.HTTP_HEADER)


def headers_of(head: bytes) -> dict[str, str]:
    """An HTTP/1.1 head's header fields, names lower-cased (its start line left out)."""
    fields = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return fields


def content_length(head: bytes) -> int:
    """An HTTP/1.1 head's ``Content-Length`` (0 without one), for the tests' own raw servers."""
    return int(headers_of(head.partition(b"\r\n\r\n")[0]).get("content-length", "0"))


def read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP/1.1 answer framed by its ``Content-Length``, read from a raw socket: (head, body)."""
    got = b""
    while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < content_length(got):
        data = sock.recv(65536)
        assert data, f"the connection closed mid-answer: {got[:300]!r}"
        got += data
    head, _, body = got.partition(b"\r\n\r\n")
    return head, body
