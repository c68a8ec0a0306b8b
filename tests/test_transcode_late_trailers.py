"""Ground truth for transcode's stream end: work that overlapped the wait for the trailers held nothing back.

A gRPC upstream (tests/support/late_trailers_grpc.py) sends 1500 chunks in one write, so the gateway is
behind from the start and reads them out of its buffer one by one, then sends the trailers
``DELAY_MS`` later. transcode holds the last chunk for the trailers (they carry the upstream's
timing): the stream's end is their arrival, and the gateway's work on the chunks it was behind on
ended long before it. Booking that work as held back (``gw.backlog``, taken out of ``gw.upstream``)
shortened the upstream call by it: at c=32 through our grpc.aio server, whose trailers can leave a
busy server ms after its last message, the gateway's upstream side came out below zero in the packet
witness (3 and 7 of ~1700 records; 2048-token streams at c=1: 3 of 56). The same holds when the late
trailers carry an error (the stream fails after its chunks): the error event's timing is the same
gateway's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pathprobe import timing

from tests.support.clients import http_post, sse_events
from tests.support.procs import fake_upstream_behind

CHUNKS = 1500
DELAY_MS = 300.0


def _stream(url: str) -> list[object]:
    status, _, body = http_post(url, {"prompt": "hello", "max_tokens": CHUNKS, "stream": True})
    assert status == 200, body[:300]
    return sse_events(body)


@pytest.mark.parametrize("status", [0, 8], ids=["ok", "error"])
def test_work_done_before_late_trailers_is_not_held_back(tmp_path: Path, status: int) -> None:
    up = ("tests.support.late_trailers_grpc", "--chunks", str(CHUNKS), "--trailer-delay-ms", str(DELAY_MS))
    with fake_upstream_behind(tmp_path, "transcode", *up, "--status", str(status)) as url:
        runs = [_stream(f"{url}/v1/generate") for _ in range(3)]
    for events in runs:
        chunks = [e for e in events if isinstance(e, dict) and "error" not in e]
        if status:  # the chunks, then the error with the timing (no [DONE])
            assert len(chunks) == CHUNKS and isinstance(events[-1], dict), events[-1:]
            assert events[-1]["error"]["code"] == 429, events[-1]
            timed = events[-1]
        else:
            assert events[-1] == "[DONE]"
            assert len(chunks) == CHUNKS
            timed = chunks[-1]
        hop = timing.parse_chain(timed["server_timing"]).hops[-1]
        where = {k: round(v, 2) for k, v in hop.entries.items()}
        # the gateway caught up on 1500 chunks well inside the 300 ms before the trailers: nothing it did
        # after the last chunk's arrival held the stream's end back (before the fix: the whole backlog)
        held = hop.get("backlog") + hop.get("decode") + hop.get("encode") + hop.get("send")
        assert held < 5.0, where
        assert hop.get("upstream") >= DELAY_MS - 5.0, where
