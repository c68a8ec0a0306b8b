"""The gateway's own gRPC client (:mod:`pathprobe.gateway.grpcup`) against our real server on loopback.

What transcode relies on: answers, statuses, trailers and deadlines as grpc.aio gives them, many calls
on one connection, a dead upstream named, and every message stamped with when its bytes reached the
host, whatever the loop was doing then (the part grpc.aio could not give)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import grpc.aio
import pytest
from pathprobe import loopwait, timing
from pathprobe.gateway import grpcup
from pathprobe.v1 import llm_pb2

from tests.support.procs import Server, free_port

GENERATE = "/pathprobe.v1.LLM/Generate"
STREAM = "/pathprobe.v1.LLM/GenerateStream"
T = TypeVar("T")


def _run(target: str, body: Callable[[grpcup.Channel], Awaitable[T]]) -> T:
    async def main() -> T:
        loopwait.install()
        ch = grpcup.Channel(target)
        try:
            return await body(ch)
        finally:
            await ch.close()

    return asyncio.run(main())


def _req(tokens: int, prompt: str = "hello there") -> bytes:
    return llm_pb2.GenerateRequest(prompt=prompt, max_tokens=tokens, ignore_eos=True).SerializeToString()


def test_unary_and_stream_answers_and_trailers(synthetic_server) -> None:
    async def body(ch: grpcup.Channel) -> tuple[llm_pb2.GenerateResponse, list[llm_pb2.GenerateChunk], list[str]]:
        t0 = timing.now_ms()
        call = await ch.call(GENERATE, _req(5), 10.0)
        resp = llm_pb2.GenerateResponse.FromString(await call)
        md = await call.trailing_metadata()
        assert call.ended_ms is not None and t0 <= call.ended_ms <= timing.now_ms()
        stream = await ch.call(STREAM, _req(7), 10.0)
        chunks = []
        async for raw in stream:
            assert stream.arrived_ms is not None and t0 <= stream.arrived_ms <= timing.now_ms()
            chunks.append(llm_pb2.GenerateChunk.FromString(raw))
        md2 = await stream.trailing_metadata()
        return resp, chunks, [str(v) for k, v in (*md, *md2) if k == timing.METADATA_KEY]

    resp, chunks, timings = _run(synthetic_server.grpc_target, body)
    assert resp.usage.completion_tokens == 5
    assert sum(1 for c in chunks if c.text or c.finish_reason) >= 7 and chunks[-1].finish_reason
    assert len(timings) == 2 and all("srv.total" in t for t in timings)


def test_a_status_its_details_and_a_dead_upstream(synthetic_server) -> None:
    async def body(ch: grpcup.Channel) -> grpc.aio.AioRpcError:
        call = await ch.call(GENERATE, _req(-3), 10.0)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        return err.value

    err = _run(synthetic_server.grpc_target, body)
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT and "max_tokens" in (err.details() or "")

    dead = f"127.0.0.1:{free_port()}"

    async def dead_body(ch: grpcup.Channel) -> grpc.aio.AioRpcError | None:
        call = await ch.call(GENERATE, _req(3), 10.0)
        return call.failure()

    failure = _run(dead, dead_body)
    assert failure is not None and failure.code() is grpc.StatusCode.UNAVAILABLE
    assert "failed to connect" in (failure.details() or "") and dead in (failure.details() or "")


def test_deadline_and_cancel_reset_the_stream_and_the_connection_keeps_serving(tmp_path) -> None:
    srv = Server(tmp_path, "--engine", "synthetic", "--decode-ms-per-token", "20")
    try:

        async def body(ch: grpcup.Channel) -> tuple[float, grpc.StatusCode, int]:
            t0 = time.monotonic()
            slow = await ch.call(STREAM, _req(200), 0.3)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in slow:
                    pass
            took = time.monotonic() - t0
            other = await ch.call(STREAM, _req(200), 10.0)
            async for _ in other:
                break
            assert other.cancel() and other.done()
            with pytest.raises(grpc.aio.AioRpcError) as cancelled:
                async for _ in other:
                    pass
            assert cancelled.value.code() is grpc.StatusCode.CANCELLED
            after = llm_pb2.GenerateResponse.FromString(await (await ch.call(GENERATE, _req(2), 10.0)))
            return took, err.value.code(), after.usage.completion_tokens

        took, code, tokens = _run(srv.grpc_target, body)
    finally:
        srv.stop()
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.25 <= took < 2.0, took  # 200 tokens would take 4 s
    assert tokens == 2


def test_calls_take_their_own_connections_up_to_the_pool_and_a_large_request_flows(synthetic_server) -> None:
    async def body(ch: grpcup.Channel) -> tuple[list[int], str, int]:
        ch.pool_size = 4
        calls = [await ch.call(GENERATE, _req(3), 20.0) for _ in range(64)]
        opened = ch.connections  # 64 calls in flight: 4 connections, 16 streams each
        answers = await asyncio.gather(*(_answer(c) for c in calls))
        # a 600 kB prompt: far over HTTP/2's default 64 KiB window, so it waits for WINDOW_UPDATEs; the
        # server reads it whole and counts its tokens (over its context: INVALID_ARGUMENT, naming them)
        big = await ch.call(GENERATE, _req(2, "word " * 120_000), 30.0)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await big
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        return answers, err.value.details() or "", opened

    answers, details, opened = _run(synthetic_server.grpc_target, body)
    assert answers == [3] * 64
    counted = re.search(r"\((\d+) tokens\)", details)
    assert counted is not None and int(counted.group(1)) >= 100_000, details
    assert opened == 4


async def _answer(call: grpcup.Call) -> int:
    return llm_pb2.GenerateResponse.FromString(await call).usage.completion_tokens


def test_a_message_read_late_keeps_when_it_arrived(synthetic_server) -> None:
    """The loop blocked for 150 ms while the stream's next chunks came in: each chunk read after the
    block carries its arrival from before it (the kernel's stamp), so the gateway's lateness is its
    own: the wait from arrival to read is >= 100 ms for the first chunk read after the block, and
    under 5 ms on the chunks read while the loop kept up."""

    async def body(ch: grpcup.Channel) -> tuple[list[float], float]:
        call = await ch.call(STREAM, _req(40), 10.0)
        ages: list[float] = []
        blocked_age = -1.0
        i = 0
        async for _ in call:
            seen = timing.now_ms()
            assert call.arrived_ms is not None
            if i == 5:
                time.sleep(0.15)  # noqa: ASYNC251 -- the loop is busy: the next chunks wait in the socket
            elif i == 6:
                blocked_age = seen - call.arrived_ms
            else:
                ages.append(seen - call.arrived_ms)
            i += 1
        return ages, blocked_age

    ages, blocked_age = _run(synthetic_server.grpc_target, body)
    assert blocked_age >= 100.0, blocked_age
    kept_up = sorted(ages[:5])
    assert kept_up[len(kept_up) // 2] < 5.0, kept_up


def test_an_answer_read_late_keeps_its_own_arrival_while_another_call_streams_on(synthetic_server) -> None:
    """The loop was blocked 150 ms from the moment a unary call went out while a stream kept sending: the
    answer's end is dated by its own bytes (>= 100 ms before it was read), not by the stream's chunks
    that came after it. On one connection shared by both (``pool_size=1``), the kernel merges the
    queued bytes into one buffer stamped with the latest chunk: 3.3-3.6 ms here."""

    async def body(ch: grpcup.Channel) -> float:
        stream = await ch.call(STREAM, _req(300), 10.0)
        async for _ in stream:
            break  # the stream is going
        unary = await ch.call(GENERATE, _req(1), 10.0)
        time.sleep(0.15)  # noqa: ASYNC251 -- the loop busy: the answer, then the stream's chunks, wait
        await unary
        seen = timing.now_ms()
        stream.cancel()
        assert unary.ended_ms is not None
        return seen - unary.ended_ms

    assert _run(synthetic_server.grpc_target, body) >= 100.0


def test_an_upstream_killed_mid_stream_is_unavailable(tmp_path) -> None:
    srv = Server(tmp_path, "--engine", "synthetic", "--decode-ms-per-token", "20")

    async def body(ch: grpcup.Channel) -> grpc.aio.AioRpcError:
        call = await ch.call(STREAM, _req(200), 20.0)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                if srv.popen.poll() is None:
                    srv.popen.kill()
        return err.value

    try:
        err = _run(srv.grpc_target, body)
    finally:
        srv.stop()
    assert err.code() is grpc.StatusCode.UNAVAILABLE, err
