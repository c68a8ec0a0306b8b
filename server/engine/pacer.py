"""Sub-millisecond sleeps for the event loop.

``asyncio.sleep`` wakes up to ~1 ms late (epoll's timeout is in whole milliseconds),
which bunches tokens of an engine that emits one every 0.5 ms. :class:`Pacer` keeps a
heap of deadlines in one thread that sleeps with ``time.sleep`` (nanosleep, ~0.1 ms
late) and wakes the loop with ``call_soon_threadsafe``; nothing spins.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time

from pathprobe.timing import now_ms


class Pacer:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="pathprobe-pacer", daemon=True)
        self._thread.start()

    async def sleep_until(self, deadline_ms: float) -> None:
        if deadline_ms <= now_ms():
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        with self._cond:
            heapq.heappush(self._heap, (deadline_ms, next(self._seq), fut))
            self._cond.notify()
        await fut

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=1)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                deadline = self._heap[0][0]
                wait = deadline - now_ms()
                if wait > 2.0:  # far away: a condition wait (new earlier deadlines interrupt it)
                    self._cond.wait((wait - 1.0) / 1000.0)
                    continue
                due = []
                now = now_ms()
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
            if due:
                self._loop.call_soon_threadsafe(_wake, due)
            elif wait > 0:
                time.sleep(wait / 1000.0)


def _wake(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)
