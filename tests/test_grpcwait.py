"""Ground truth for a grpc.aio hop's wait before its handler (:mod:`pathprobe.grpcwait`).

gRPC's core holds a call until the Python side asks for it; the handler reads how long from the
caller's declared deadline. Checked against real gRPC: the declared value is what core sent (its
rounding of the header), a blocked loop's wait is measured within core's 1 ms clock, and through a
real server (tests/support/blocking_server.py: its loop blocked by a test-only route) the wait is
the server's queueing, not the link's network.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest
from pathprobe import grpcwait, segments, timing
from pathprobe.analysis.lab.procs import free_port
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

from tests.support.procs import Proc, wait_http

TIMEOUTS_S = (1.5, 9.999, 10.0, 30.0, 60.0, 100.0, 600.0)


def test_the_declared_timeout_is_what_gRPC_sends_and_a_blocked_loop_is_measured() -> None:
    got: list[tuple[float, float | None]] = []  # (handler start, its measured wait)

    async def handler(req: bytes, ctx: grpc.aio.ServicerContext) -> bytes:
        got.append(
            (
                time.perf_counter(),
                grpcwait.wait_ms(grpcwait.declared_ms(ctx.invocation_metadata()), ctx.time_remaining()),
            )
        )
        return req

    async def block_every(period_s: float, ms: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            time.sleep(ms / 1000.0)  # noqa: ASYNC251 - the loop's thread: the calls wait for it

    calls: list[tuple[float, float]] = []  # (send, timeout given)

    def client(port: int) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            f = ch.unary_unary("/t.T/Echo")
            for i in range(140):
                md: list[tuple[str, str | bytes]] = []
                timeout = grpcwait.declare(TIMEOUTS_S[i % len(TIMEOUTS_S)], md)
                t = time.perf_counter()
                f(b"x", timeout=timeout, metadata=md)
                calls.append((t, timeout or 0.0))
                time.sleep(0.004)

    async def main() -> None:
        srv = grpc.aio.server()
        h = grpc.unary_unary_rpc_method_handler(handler)
        srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", {"Echo": h}),))
        port = srv.add_insecure_port("127.0.0.1:0")
        await srv.start()
        blocker = asyncio.ensure_future(block_every(0.1, 30.0))
        th = threading.Thread(target=client, args=(port,))
        th.start()
        while th.is_alive():
            await asyncio.sleep(0.02)
        blocker.cancel()
        await srv.stop(None)

    asyncio.run(main())
    assert len(got) == len(calls) == 140
    true = [(start - sent) * 1000.0 for (start, _), (sent, _) in zip(got, calls, strict=True)]
    errors = [w - t for (_, w), t in zip(got, true, strict=True) if w is not None and w > 0]
    # every timeout in [1, 1000) s was declared, and the wait read from it is the true one (less
    # the 1 ms resolution taken off, within core's ms clock); a wrong rounding would be 10-1000 ms off
    assert all(w is not None for _, w in got)
    assert len(errors) >= 20 and max(true) > 20.0  # some calls waited for the blocked loop
    # over-stating is the failure that matters (a wait booked that the call did not have): within
    # core's 1 ms clock for nine calls in ten (a wrong rounding would put most calls 10-1000 ms off).
    # Core reads a cached clock (per batch of work), which is stale when it anchors the deadline after
    # its thread was preempted mid-batch: 1.07 ms seen with a benchmark beside it, and one call of 140
    # over by 8.5 ms in a fresh-clone run on a busy 2-core machine (2026-12-04); so beyond 2.5 ms at
    # most one call in 50. Under-stating has a test-made tail: `true` starts at the client thread's
    # clock read, and that thread can then wait for the GIL (a 5 ms switch interval) before its
    # headers leave; so most calls within 2.5 ms, every call within 6 ms
    errs = sorted(errors)
    tenth = len(errs) // 10
    assert errs[-1 - tenth] <= 1.0 and sum(e > 2.5 for e in errs) <= len(errs) // 50, errs[-5:]
    assert errs[tenth] >= -2.5 and errs[0] >= -6.0, errs[:5]
    assert grpcwait.caller_timeout(0.5) == (0.5, None)  # outside [1, 1000) s: nothing declared


def test_a_blocked_grpc_front_end_is_the_servers_queueing_not_network(tmp_path: Path) -> None:
    g, h = free_port(), free_port()
    script = Path(__file__).parent / "support" / "blocking_server.py"
    proc = Proc([sys.executable, str(script), str(g), str(h)], tmp_path / "server.log")
    req = llm_pb2.GenerateRequest(prompt="hello", max_tokens=8)
    try:
        wait_http(f"http://127.0.0.1:{h}/healthz", 120, proc.popen)
        with grpc.insecure_channel(f"127.0.0.1:{g}") as ch:
            stub = llm_pb2_grpc.LLMStub(ch)

            def call() -> tuple[float, dict[str, float]]:
                md: list[tuple[str, str | bytes]] = []
                timeout = grpcwait.declare(30.0, md)
                t0 = time.perf_counter()
                _, c = stub.Generate.with_call(req, timeout=timeout, metadata=md)
                return (time.perf_counter() - t0) * 1000.0, timing.parse_all(
                    v for k, v in c.trailing_metadata() if k == timing.METADATA_KEY
                )

            idle = [call() for _ in range(20)]  # one at a time: the loop is idle
            out: list[tuple[float, dict[str, float]] | None] = [None] * 4
            go = threading.Barrier(5)

            def waiter(i: int) -> None:
                go.wait()
                out[i] = call()

            threads = [threading.Thread(target=waiter, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            import http.client

            blocker = http.client.HTTPConnection("127.0.0.1", h, timeout=30)
            blocker.request("POST", "/test/block", b'{"ms": 400}', {"Content-Type": "application/json"})
            time.sleep(0.1)
            go.wait()  # sent while the loop is blocked: gRPC's core holds them
            blocker.getresponse().read()
            for t in threads:
                t.join(30)
    finally:
        proc.stop()
    idle_waits = [e.get("srv.wait", 0.0) for _, e in idle]
    assert statistics.median(idle_waits) < 0.5, idle_waits  # an idle front end: its link is as it was
    idle_net = statistics.median(segments.split(*r).network for r in idle)
    for r in out:
        assert r is not None
        e2e, entries = r
        s = segments.split(e2e, entries)
        # blocked >= 400 - 100 ms after they were sent (less the threads' start skew)
        assert 250.0 <= entries["srv.wait"] <= 550.0, entries
        assert s.queueing >= 250.0 and 0.0 <= s.network < idle_net + 5.0, (s, idle_net)


@pytest.mark.parametrize("timeout_s", TIMEOUTS_S)
def test_a_declared_timeout_is_three_figures_and_the_one_given_rounds_up_to_it(timeout_s: float) -> None:
    given, declared = grpcwait.caller_timeout(timeout_s)
    assert declared is not None
    d = float(declared)
    assert d <= timeout_s * 1000.0 and given * 1000.0 < d and d - given * 1000.0 <= 0.5 * d / 100
    assert len(str(int(d)).rstrip("0")) <= 3
