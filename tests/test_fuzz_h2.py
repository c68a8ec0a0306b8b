"""Bad input at the passthrough HTTP/2 relay (gateway/h2proxy.py), sent raw with the ``h2`` /
``hyperframe`` / ``hpack`` libraries: malformed frames, invalid protobuf, oversize messages.
After every bad connection the relay is still serving and a good call goes through; nothing is
logged as a crash. Budget: a few hundred frames, seeded."""

from __future__ import annotations

import random
import socket
import struct

import grpc
import pytest
from hpack import Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

from tests.support.procs import Server

pytestmark = pytest.mark.slow
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
GENERATE = "/pathprobe.v1.LLM/Generate"
CRASH_MARKS = ("Traceback", "Exception in callback", "Fatal error", "Unhandled")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("h2fuzz"), "--engine", "synthetic", "--max-body-bytes", "65536")
    yield srv
    srv.stop()


@pytest.fixture(scope="module", params=["plain", "rewrite"])
def relay(request, server, tmp_path_factory):
    """The relay as it forwards header blocks untouched, and as it re-encodes them (API key set)."""
    from tests.test_gateway import Gateway

    extra = ("--api-key", "k") if request.param == "rewrite" else ()
    gw = Gateway(
        tmp_path_factory.mktemp("h2fuzz-gw"),
        "passthrough",
        server.grpc_target,
        "--impl",
        "h2",
        "--max-body-bytes",
        "65536",
        "--log-level",
        "INFO",
        *extra,
    )
    gw.key = "k" if extra else None
    yield gw
    gw.stop()


def good_call(gw) -> None:
    md = (("authorization", f"Bearer {gw.key}"),) if gw.key else ()
    with grpc.insecure_channel(gw.target) as ch:
        resp = llm_pb2_grpc.LLMStub(ch).Generate(
            llm_pb2.GenerateRequest(prompt="hi", max_tokens=2), timeout=10, metadata=md
        )
    assert resp.usage.completion_tokens == 2


def request_headers(gw, path: str = GENERATE) -> list[tuple[str, str]]:
    h = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", gw.target),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]
    if gw.key:
        h.append(("authorization", f"Bearer {gw.key}"))
    return h


def grpc_message(body: bytes, declared: int | None = None) -> bytes:
    return b"\x00" + struct.pack(">I", len(body) if declared is None else declared) + body


def exchange(gw, data: bytes, read_s: float = 1.0) -> bytes:
    """Send ``data`` after the preface on a fresh connection; return what came back (until close/timeout)."""
    out = b""
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        s.settimeout(read_s)
        try:
            s.sendall(PREFACE + SettingsFrame(0).serialize() + data)
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            pass
    return out


def grpc_status_of(raw: bytes) -> list[str]:
    """grpc-status values in the response header blocks (decoded with a fresh HPACK decoder)."""
    from hpack import Decoder

    dec = Decoder()
    out, pos = [], 0
    while pos + 9 <= len(raw):
        length = int.from_bytes(raw[pos : pos + 3], "big")
        ftype = raw[pos + 3]
        payload = raw[pos + 9 : pos + 9 + length]
        if ftype == 1:  # HEADERS (no padding/priority from these servers)
            try:
                for k, v in dec.decode(payload):
                    if k == "grpc-status":
                        out.append(v)
            except Exception:
                pass
        pos += 9 + length
    return out


def assert_alive(gw) -> None:
    assert gw.popen.poll() is None, gw.log()
    good_call(gw)
    log = gw.log()
    assert not any(m in log for m in CRASH_MARKS), log[-3000:]


# ------------------------------------------------------------------------------ protocol-level
def test_invalid_protobuf_is_invalid_argument(relay) -> None:
    enc = Encoder()
    hdr = HeadersFrame(1, enc.encode(request_headers(relay)), flags=["END_HEADERS"]).serialize()
    data = DataFrame(1, grpc_message(b"\xff\xff\xff\xff garbage"), flags=["END_STREAM"]).serialize()
    raw = exchange(relay, hdr + data)
    assert "3" in grpc_status_of(raw), raw[:400]  # INVALID_ARGUMENT from the server, relayed
    assert_alive(relay)


def test_oversize_message_is_refused(relay) -> None:
    enc = Encoder()
    hdr = HeadersFrame(1, enc.encode(request_headers(relay)), flags=["END_HEADERS"]).serialize()
    body = grpc_message(b"x" * 70_000)
    frames = b"".join(DataFrame(1, body[i : i + 16384]).serialize() for i in range(0, len(body), 16384))
    raw = exchange(relay, hdr + frames + DataFrame(1, b"", flags=["END_STREAM"]).serialize())
    # a trailers-only RESOURCE_EXHAUSTED naming the limit, then RST_STREAM(NO_ERROR) to stop the client's sending
    assert "8" in grpc_status_of(raw), raw[:400]
    assert any(raw[p + 3] == 3 for p in _frame_starts(raw)), raw[:200]
    assert_alive(relay)


def _frame_starts(raw: bytes) -> list[int]:
    out, pos = [], 0
    while pos + 9 <= len(raw):
        out.append(pos)
        pos += 9 + int.from_bytes(raw[pos : pos + 3], "big")
    return out


MALFORMED = {
    "garbage-after-preface": b"\x00\x01\x02 this is not a frame at all" * 10,
    "bad-preface": None,  # handled below
    "headers-garbage-hpack": HeadersFrame(1, b"\xff\xff\xff\xff\x7f\x00", flags=["END_HEADERS"]).serialize(),
    "headers-padded-empty": bytes.fromhex("000000") + bytes((1, 0x8 | 0x4)) + (1).to_bytes(4, "big"),
    "headers-pad-too-long": bytes.fromhex("000002") + bytes((1, 0x8 | 0x4)) + (1).to_bytes(4, "big") + b"\xff\x00",
    "headers-priority-short": bytes.fromhex("000002") + bytes((1, 0x20 | 0x4)) + (1).to_bytes(4, "big") + b"\x00\x00",
    "continuation-alone": ContinuationFrame(1, b"\x82", flags=["END_HEADERS"]).serialize(),
    "data-on-stream-0": DataFrame(0, b"hello").serialize()
    if False
    else bytes.fromhex("000005") + bytes((0, 0)) + (0).to_bytes(4, "big") + b"hello",
    "data-idle-stream": DataFrame(7, b"hello", flags=["END_STREAM"]).serialize(),
    "rst-idle-stream": RstStreamFrame(9, 2).serialize(),
    "rst-short": bytes.fromhex("000002") + bytes((3, 0)) + (1).to_bytes(4, "big") + b"\x00\x00",
    "window-update-zero": WindowUpdateFrame(0, 1).serialize()[:-4] + b"\x00\x00\x00\x00",
    "window-update-overflow": WindowUpdateFrame(0, 2**31 - 1).serialize() * 3,
    "settings-bad-size": bytes.fromhex("000005") + bytes((4, 0)) + (0).to_bytes(4, "big") + b"\x00\x01\x00\x00\x00",
    "settings-on-stream": bytes.fromhex("000000") + bytes((4, 0)) + (3).to_bytes(4, "big"),
    "ping-short": bytes.fromhex("000003") + bytes((6, 0)) + (0).to_bytes(4, "big") + b"abc",
    "priority-self": PriorityFrame(5, depends_on=5).serialize(),
    "goaway-from-client": GoAwayFrame(0, 0, 0, b"bye").serialize(),
    "unknown-type": bytes.fromhex("000004") + bytes((0xEE, 0xFF)) + (1).to_bytes(4, "big") + b"abcd",
    "length-lies": bytes.fromhex("ffffff") + bytes((0, 0)) + (1).to_bytes(4, "big") + b"short",
    "even-stream-id": HeadersFrame(
        2, Encoder().encode([(":method", "POST"), (":path", GENERATE)]), flags=["END_HEADERS", "END_STREAM"]
    ).serialize(),
    "ping-flood": PingFrame(0, b"12345678").serialize() * 200,
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_frames(relay, name) -> None:
    if name == "bad-preface":
        with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 100)
            s.settimeout(2)
            try:
                s.recv(100)
            except (TimeoutError, ConnectionResetError):
                pass
    else:
        exchange(relay, MALFORMED[name], read_s=0.5)
    assert_alive(relay)


def test_random_frames(relay) -> None:
    """A few hundred random frames (type, flags, stream, payload), after a valid request on stream 1."""
    rnd = random.Random(12)
    enc = Encoder()
    for _conn in range(12):
        frames = [HeadersFrame(1, enc.encode(request_headers(relay)), flags=["END_HEADERS"]).serialize()]
        for _ in range(25):
            ftype = rnd.choice([0, 1, 2, 3, 4, 6, 8, 9, rnd.randrange(256)])
            flags = rnd.randrange(256)
            sid = rnd.choice([0, 1, 3, rnd.randrange(2**31)])
            payload = rnd.randbytes(rnd.choice([0, 1, 4, 5, 8, 9, rnd.randrange(300)]))
            frames.append(len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big") + payload)
        exchange(relay, b"".join(frames), read_s=0.3)
        enc = Encoder()  # a fresh connection, a fresh table
    assert_alive(relay)
