"""Ground truth for a hop's wait for its own event loop (``srv.wait``, :mod:`pathprobe.loopwait`).

A real server (synthetic engine) whose loop a test-only route blocks for a known time while other
requests arrive: their wait before the handler's first timestamp must be booked as the server's
queueing, and the link's network must stay at its size on an idle loop.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from pathprobe import segments, timing
from pathprobe.analysis.lab.procs import free_port

from tests.support.clients import timed_generate
from tests.support.procs import Proc, wait_http

BLOCK_MS = 400.0  # the loop is blocked this long
LATE_MS = 100.0  # the other requests are sent this long after the block began
WAITERS = 6
BODY = json.dumps({"prompt": "hello", "max_tokens": 8}).encode()
HEADERS = {"Content-Type": "application/json"}


def _generate(conn: http.client.HTTPConnection) -> tuple[float, dict[str, float]]:
    """(e2e ms, the server's entries) of one native unary call on a kept-alive connection."""
    e2e, header = timed_generate(conn, BODY)
    return e2e, timing.parse(header)


def _split(e2e: float, entries: dict[str, float]) -> segments.Split:
    return segments.split(e2e, entries)


def test_a_blocked_loop_is_the_servers_queueing_not_network(tmp_path: Path) -> None:
    g, h = free_port(), free_port()
    script = Path(__file__).parent / "support" / "blocking_server.py"
    proc = Proc([sys.executable, str(script), str(g), str(h)], tmp_path / "server.log")
    try:
        wait_http(f"http://127.0.0.1:{h}/healthz", 120, proc.popen)
        conns = [http.client.HTTPConnection("127.0.0.1", h, timeout=30) for _ in range(WAITERS)]
        idle = [_generate(c) for _ in range(5) for c in conns]  # one at a time: the loop is idle
        idle_net = statistics.median(_split(*r).network for r in idle)
        assert all("srv.wait" in r[1] for r in idle), idle[0]

        blocker = http.client.HTTPConnection("127.0.0.1", h, timeout=30)
        out: list[tuple[float, dict[str, float]] | None] = [None] * WAITERS
        go = threading.Barrier(WAITERS + 1)

        def waiter(i: int) -> None:
            go.wait()
            out[i] = _generate(conns[i])

        threads = [threading.Thread(target=waiter, args=(i,)) for i in range(WAITERS)]
        for t in threads:
            t.start()
        blocker.request("POST", "/test/block", json.dumps({"ms": BLOCK_MS}).encode(), HEADERS)
        time.sleep(LATE_MS / 1000.0)
        go.wait()  # the waiters send now, while the loop is blocked
        blocker.getresponse().read()
        for t in threads:
            t.join(30)
    finally:
        proc.stop()
    for e2e, entries in (r for r in out if r is not None):
        s = _split(e2e, entries)
        # the loop was blocked for at least BLOCK_MS - LATE_MS after they were sent (less the threads'
        # start skew); the wait is an upper bound from the loop's last poll before the block
        assert entries["srv.wait"] > BLOCK_MS - LATE_MS - 50, entries
        assert entries["srv.wait"] < BLOCK_MS + 150, entries
        assert s.queueing >= BLOCK_MS - LATE_MS - 50, s
        assert 0.0 <= s.network < idle_net + 5.0, (s, idle_net)
    assert all(r is not None for r in out)


def test_a_hops_wait_is_its_queueing_taken_from_its_link_and_capped() -> None:
    direct = {"srv.decode": 0.1, "srv.encode": 0.1, "srv.wait": 3.0, "srv.total": 1.0}
    s = segments.split(10.0, direct)
    assert s.queueing == 3.0 and s.hop_wait == 3.0
    assert abs(s.network - 6.0) < 1e-9 and s.hops[0].wait == 3.0
    assert abs(sum(getattr(s, k) for k in segments.SEGMENTS) - 10.0) < 1e-9
    # an upper bound above the link's time takes the link, never more
    s = segments.split(2.0, {**direct, "srv.wait": 5.0})
    assert s.network == 0.0 and abs(s.queueing - 1.0) < 1e-9
    # a gateway's wait comes out of the client's link, the server's out of the gateway's upstream link
    chain = timing.parse_chain("srv.wait;dur=1, srv.total;dur=2, gw.upstream;dur=5, gw.wait;dur=4, gw.total;dur=6")
    s = segments.split(12.0, chain)
    assert [round(x, 9) for x in s.links] == [2.0, 2.0] and s.queueing == 5.0
    # the client's own wait then comes out of what is left of its link
    s = segments.split(12.0, chain, client_wait_ms=3.0)
    assert s.links[0] == 0.0 and s.client_wait == 2.0


def test_the_watch_floors_a_socket_at_the_last_poll_when_the_loop_was_busy() -> None:
    import asyncio
    import socket

    from pathprobe import loopwait

    async def main() -> tuple[float, float, float | None]:
        watch = loopwait.install()
        assert watch is not None and loopwait.install() is watch
        a, b = socket.socketpair()
        got: list[float] = []
        loop = asyncio.get_running_loop()
        loop.add_reader(a.fileno(), lambda: got.append(timing.now_ms()) or a.recv(10))
        await asyncio.sleep(0.01)
        busy_from = timing.now_ms()
        time.sleep(0.05)  # noqa: ASYNC251 - the loop is busy: the bytes below wait for it
        b.send(b"x")
        time.sleep(0.05)  # noqa: ASYNC251
        await asyncio.sleep(0.01)
        floor = watch.take(a.fileno())
        loop.remove_reader(a.fileno())
        a.close()
        b.close()
        assert floor is not None
        return busy_from, floor, got[0] if got else None

    busy_from, floor, seen = asyncio.run(main())
    assert seen is not None and floor <= busy_from and busy_from - floor < 20.0  # the poll right before
    assert seen - floor >= 100.0


def test_a_connections_floor_is_its_bytes_kernel_stamp_when_that_is_later() -> None:
    """A request that came halfway through a busy stretch: the watch floors it at the poll before the
    stretch (its wait would be the whole stretch, over what the bytes waited); the kernel's stamp of
    the connection's read (from its second request on) puts it where the bytes came."""
    import asyncio
    import socket

    from pathprobe import loopwait

    class Conn(asyncio.Protocol):
        def __init__(self) -> None:
            self.requests: asyncio.Queue[float] = asyncio.Queue()

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.requests.put_nowait(timing.now_ms())

    async def main() -> tuple[float | None, float | None, float, float, float]:
        watch = loopwait.install()
        assert watch is not None
        with socket.create_server(("127.0.0.1", 0)) as srv:  # TCP: the kernel stamps what it receives
            b = socket.create_connection(srv.getsockname())
            a, _ = srv.accept()
        loop = asyncio.get_running_loop()
        _, conn = await loop.connect_accepted_socket(Conn, a)
        b.send(b"first")
        await conn.requests.get()
        first = loopwait.floor_of(conn.transport)  # its read was not stamped: the watch's floor alone
        await asyncio.sleep(0.01)
        busy_from = timing.now_ms()
        time.sleep(0.05)  # noqa: ASYNC251 - the loop is busy: the bytes below wait for it
        sent = timing.now_ms()
        b.send(b"second")
        time.sleep(0.05)  # noqa: ASYNC251
        seen = await conn.requests.get()
        floor = loopwait.floor_of(conn.transport)
        conn.transport.close()
        b.close()
        return first, floor, busy_from, sent, seen

    first, floor, busy_from, sent, seen = asyncio.run(main())
    assert first is not None
    assert floor is not None and sent - 1.0 <= floor <= sent + 5.0, (floor - busy_from, sent - busy_from)
    assert seen - floor >= 45.0  # the wait booked: from the bytes' arrival, not from the poll before


def test_the_watch_tells_a_loop_that_slept_from_one_that_was_busy() -> None:
    """:meth:`LoopWatch.idle_between`: a stretch in which the loop slept in ``select`` (it had nothing to
    run: a consumer there was waiting) against one it spent busy (a consumer there was behind)."""
    import asyncio

    from pathprobe import loopwait

    async def main() -> tuple[float, float, float, float]:
        assert loopwait.install() is not None
        t0 = timing.now_ms()
        await asyncio.sleep(0.02)  # the loop sleeps
        t1 = timing.now_ms()
        time.sleep(0.02)  # noqa: ASYNC251 - the loop is busy, never in select
        t2 = timing.now_ms()
        await asyncio.sleep(0)
        return t0, t1, t2, timing.now_ms()

    t0, t1, t2, _ = asyncio.run(main())
    # the watch of that loop is gone with it: check on a fresh one the same way
    watch = loopwait.LoopWatch()
    watch.sleeps.append((t0 + 1.0, t1 - 1.0))
    idle = watch.idle_between()
    assert idle(t0, t1) and idle(t1 - 2.0, t2)  # the sleep reaches into the stretch
    assert not idle(t1, t2)  # busy all along

    async def recorded() -> bool:
        watch = loopwait.install()
        assert watch is not None
        await asyncio.sleep(0.02)
        a = timing.now_ms()
        time.sleep(0.02)  # noqa: ASYNC251
        b = timing.now_ms()
        await asyncio.sleep(0.02)
        c = timing.now_ms()
        idle = watch.idle_between()
        return not idle(a + 0.5, b - 0.5) and idle(b, c)

    assert asyncio.run(recorded())


def test_a_body_read_is_a_wait_for_bytes_only_where_the_loop_slept() -> None:
    """:func:`loopwait.body_wait_ms`: a read during which the loop slept waited for bytes (the read);
    one during which it was busy waited for the loop (0); an unwatched loop tells nothing (None)."""
    import asyncio

    from pathprobe import loopwait

    async def unwatched() -> float | None:
        t = timing.now_ms()
        await asyncio.sleep(0.01)
        return loopwait.body_wait_ms(t, timing.now_ms())

    async def watched() -> tuple[float | None, float | None, float, float]:
        assert loopwait.install() is not None
        await asyncio.sleep(0)
        a = timing.now_ms()
        await asyncio.sleep(0.02)  # the bytes are late: the loop sleeps
        b = timing.now_ms()
        slept = loopwait.body_wait_ms(a, b)
        c = timing.now_ms()
        time.sleep(0.02)  # noqa: ASYNC251 - the bytes were in; the loop was busy with others
        busy = loopwait.body_wait_ms(c, timing.now_ms())
        return slept, busy, a, b

    assert asyncio.run(unwatched()) is None
    slept, busy, a, b = asyncio.run(watched())
    assert slept == b - a and slept >= 19.0
    assert busy == 0.0


def test_a_gateways_wait_after_its_upstream_answered_is_its_queueing_taken_from_that_link() -> None:
    # the gateway saw its upstream take 10 ms, 6 of them with the answer in and its loop busy
    chain = timing.parse_chain("srv.total;dur=2, gw.upstream;dur=10, gw.upwait;dur=6, gw.total;dur=11")
    s = segments.split(13.0, chain)
    assert [round(x, 9) for x in s.links] == [2.0, 2.0] and s.queueing == 6.0 and s.hop_wait == 6.0
    gw = s.hops[0]
    assert gw.label.startswith("gw") and gw.wait == 6.0 and gw.upwait == 6.0
    assert abs(sum(getattr(s, k) for k in segments.SEGMENTS) - 13.0) < 1e-9
    # an upper bound above the link's time takes the link, never more
    s = segments.split(
        13.0, timing.parse_chain("srv.total;dur=2, gw.upstream;dur=10, gw.upwait;dur=20, gw.total;dur=11")
    )
    assert [round(x, 9) for x in s.links] == [2.0, 0.0] and s.queueing == 8.0 and s.hops[0].upwait == 8.0
    # a silent upstream: the wait is still the gateway's (it measured it), the rest unsplit
    s = segments.split(13.0, timing.parse_chain("gw.upstream;dur=10, gw.upwait;dur=4, gw.total;dur=11"))
    assert s.queueing == 4.0 and s.unsplit == 6.0 and s.hops[0].wait == 4.0
