"""Client wait (pathprobe.loadgen.clientwait) on a real gevent loop, and how a record books it."""

from __future__ import annotations

import statistics
import time

import gevent
from gevent.event import AsyncResult
from pathprobe.loadgen.clientwait import WaitTracker
from pathprobe.segments import split


def _burn(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def _request(tracker: WaitTracker, ready: AsyncResult) -> tuple[float, float]:
    tracker.begin()
    ready.get()
    return tracker.end()


def test_a_response_waiting_for_another_greenlet_is_client_wait():
    """Five times (median): when this process is preempted for more than GAP_NS right between the
    neighbour's end and the resume, the wait is not booked (it stays network: the safe side)."""
    tracker = WaitTracker().start()
    waits = []
    try:
        for _ in range(5):
            ready = AsyncResult()

            def busy_neighbour(ready: AsyncResult = ready) -> None:
                gevent.sleep(0.002)
                ready.set(True)  # the response is there...
                _burn(20)  # ...but the loop runs this greenlet for 20 ms more

            g = gevent.spawn(_request, tracker, ready)
            gevent.spawn(busy_neighbour)
            last, total = g.get(timeout=5)
            assert total >= last
            waits.append(last)
    finally:
        tracker.stop()
    assert 19.0 <= statistics.median(waits) <= 30.0, waits


def test_an_idle_loop_books_no_wait():
    tracker = WaitTracker().start()
    try:
        ready = AsyncResult()
        g = gevent.spawn(_request, tracker, ready)
        gevent.spawn_later(0.02, ready.set, True)  # the "server" takes 20 ms; the loop is idle meanwhile
        last, total = g.get(timeout=5)
    finally:
        tracker.stop()
    assert last < 0.5 and total < 0.5, (last, total)


def test_split_books_the_wait_as_client_time_never_below_zero_network():
    direct = {"srv.total": 4.0, "srv.prefill": 1.0}
    s = split(10.0, direct, 0.5, 0.5, client_wait_ms=1.25)  # the client's link took 10 - 1 - 4 = 5 ms
    assert s.client_wait == 1.25 and abs(s.network_hop1 - 3.75) < 1e-9 and abs(s.links[0] - 3.75) < 1e-9
    assert abs(s.network + s.serialization + s.queueing + s.inference + s.other + s.unsplit - 10.0) < 1e-9
    s = split(10.0, direct, 0.5, 0.5, client_wait_ms=50.0)  # capped: not longer than the link took
    assert s.client_wait == 5.0 and s.network_hop1 == 0.0
    assert split(10.0, direct, 0.5, 0.5).client_wait == 0.0
