"""Unit pieces of the gateway: HPACK literals, frame parsing, flag parsing, JSON re-encoding."""

from __future__ import annotations

import asyncio

import pytest
from hpack import Decoder, Encoder
from pathprobe.errors import ConfigError
from pathprobe.gateway.aio import ReadTurns, param_of
from pathprobe.gateway.common import forward_metadata, grpc_timeout, parse_upstreams
from pathprobe.gateway.h2streams import grpc_error_block
from pathprobe.gateway.reencode import request_to_json
from pathprobe.h2frames import END_HEADERS, F_PRIORITY, PADDED, fragment, literal
from pathprobe.v1 import llm_pb2


def test_literal_appends_without_moving_the_table() -> None:
    enc, dec = Encoder(), Decoder()
    first = enc.encode([(b"grpc-status", b"0"), (b"server-timing", b"srv.total;dur=1.000")])
    value = b"gw.total;dur=" + b"9" * 300  # a length that needs a multi-byte HPACK integer
    got = dec.decode(first + literal(b"server-timing", value), raw=True)
    assert got[-1] == (b"server-timing", value) and got[0] == (b"grpc-status", b"0")
    # the next block from the same encoder still decodes: our literal did not touch the table
    second = enc.encode([(b"grpc-status", b"0"), (b"server-timing", b"srv.total;dur=1.000")])
    assert dec.decode(second, raw=True) == [(b"grpc-status", b"0"), (b"server-timing", b"srv.total;dur=1.000")]


def test_fragment_strips_padding_and_keeps_priority() -> None:
    block = b"\x88\x40\x01a\x01b"
    prio = b"\x00\x00\x00\x03\x10"
    payload = bytes([4]) + prio + block + b"\x00" * 4
    assert fragment(PADDED | F_PRIORITY | END_HEADERS, payload) == (prio, block)
    assert fragment(END_HEADERS, block) == (b"", block)


def test_grpc_error_block_is_valid_hpack() -> None:
    own = {"gw.decode": 0.0, "gw.upstream": 1.5, "gw.encode": 0.0, "gw.total": 2.0}
    headers = dict(Decoder().decode(grpc_error_block(14, "upstream 127.0.0.1:1: refused", own, True), raw=True))
    assert headers[b":status"] == b"200" and headers[b"grpc-status"] == b"14"
    assert b"127.0.0.1:1" in headers[b"grpc-message"]
    assert b"gw.total;dur=2.000" in headers[b"server-timing"]


def test_flags_and_metadata() -> None:
    assert parse_upstreams("127.0.0.1:1, http://localhost:2/") == ["127.0.0.1:1", "localhost:2"]
    for bad in ("", "nohost", "h:0", "h:99999", "h:x"):
        with pytest.raises(ConfigError):
            parse_upstreams(bad)
    md = forward_metadata(
        [
            ("traceparent", "00-ab-cd-01"),
            ("user-agent", "x"),
            ("grpc-timeout", "1S"),
            ("x-tenant", "t1"),
            ("blob-bin", b"\x00"),
        ]
    )
    assert md == [("traceparent", "00-ab-cd-01"), ("x-tenant", "t1"), ("blob-bin", b"\x00")]
    assert grpc_timeout(9.2e18) is None and grpc_timeout(None) is None and grpc_timeout(1.5) == 1.5
    assert param_of("max_tokens: must be > 0") == "max_tokens" and param_of("no field here") is None


def test_request_to_json_keeps_native_types() -> None:
    req = llm_pb2.GenerateRequest(prompt="hi", max_tokens=3, seed=2**40, stop=["\n"], ignore_eos=True, temperature=0.5)
    obj = request_to_json(req)
    assert obj == {
        "prompt": "hi",
        "max_tokens": 3,
        "seed": 2**40,
        "stop": ["\n"],
        "ignore_eos": True,
        "temperature": 0.5,
    }
    assert isinstance(obj["seed"], int)  # json_format would have made it a string


def _turned(turns: ReadTurns, had: float, done: float) -> bool:
    """Whether ``turns.after`` gave the event loop a turn (a callback scheduled before it ran)."""

    async def run() -> bool:
        ran: list[bool] = []
        asyncio.get_running_loop().call_soon(ran.append, True)
        await turns.after(had, done)
        return bool(ran)

    return asyncio.run(run())


def test_read_turns_go_to_a_loop_behind_only() -> None:
    turns = ReadTurns()
    t = turns._done
    # chunks out of a buffer, back to back: a turn once 1 ms of them has gone by without one
    got = [_turned(turns, t + i * 0.2, t + i * 0.2 + 0.19) for i in range(12)]
    assert got.count(True) == 2 and got[:5] == [False] * 5, got
    # chunks 2 ms apart: each was waited for (the loop had its turn then), none of its own
    t = turns._done
    assert not any(_turned(turns, t + 2.0 * (i + 1), t + 2.0 * (i + 1) + 0.3) for i in range(5))
