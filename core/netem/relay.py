"""A delaying TCP relay: WAN-like conditions on one hop without kernel netem.

Every chunk read from one side is held until ``arrival + delay (+ jitter)`` and
then written to the other side, per direction and pipelined (a chunk never waits
for the previous one's delay, only for its departure, so order is kept as TCP
keeps it). Optional conditions:

- ``jitter_ms``: uniform extra delay in [0, jitter] per chunk (never reorders).
- ``loss``: with this probability a chunk is held one extra retransmission timeout
  (``rto_ms``, Linux' minimum is 200 ms) -- what a lost segment costs a TCP
  connection; the bytes still arrive, in order, as TCP would deliver them.
- ``rate_mbit``: a bandwidth limit per direction, shared by all connections:
  each chunk occupies the link for ``bytes * 8 / rate``.

Threads with ``time.sleep`` (clock_nanosleep) are used, not asyncio, because an
asyncio timer only fires on the event loop's ~1 ms epoll granularity; a sleeping
thread wakes within ~0.1 ms here, which matters when the test checks D +- 0.5 ms.

What a delay costs a request: ``delay_ms`` is ONE-WAY, applied to each direction
(as ``tc qdisc add dev X root netem delay D`` on both ends). A unary call crosses
the hop once each way, so it gains 2 x D; a stream's end-to-end time also gains
2 x D (request out, last chunk back) and its time to first token gains 2 x D.
"""

from __future__ import annotations

import queue
import random
import socket
import threading
import time
from dataclasses import dataclass

_BUF = 256 * 1024


@dataclass(frozen=True, slots=True)
class LinkSpec:
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    rto_ms: float = 200.0
    rate_mbit: float | None = None

    def describe(self) -> str:
        parts = [f"delay {self.delay_ms:g} ms one-way"]
        if self.jitter_ms:
            parts.append(f"jitter {self.jitter_ms:g} ms")
        if self.loss:
            parts.append(f"loss {self.loss:.2%} (RTO {self.rto_ms:g} ms)")
        if self.rate_mbit:
            parts.append(f"rate {self.rate_mbit:g} Mbit/s")
        return ", ".join(parts)


class _Link:
    """One direction's shared state: the bandwidth clock and the random source."""

    def __init__(self, spec: LinkSpec, seed: int | None) -> None:
        self.spec = spec
        self.lock = threading.Lock()
        self.free_at = 0.0
        self.rng = random.Random(seed)

    def departure(self, arrival: float, nbytes: int, last: float) -> float:
        s = self.spec
        with self.lock:
            dep = arrival + s.delay_ms / 1e3
            if s.jitter_ms:
                dep += self.rng.uniform(0.0, s.jitter_ms / 1e3)
            if s.loss and self.rng.random() < s.loss:
                dep += s.rto_ms / 1e3
            dep = max(dep, last)  # TCP delivers in order
            if s.rate_mbit:
                start = max(dep, self.free_at)
                self.free_at = start + nbytes * 8 / (s.rate_mbit * 1e6)
                dep = self.free_at
            return dep


def _sleep_until(t: float) -> None:
    while True:
        left = t - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left if left > 0.0002 else 0)


class _Pipe:
    """src -> dst through a delay line: a reader thread stamps, a writer thread releases."""

    def __init__(self, src: socket.socket, dst: socket.socket, link: _Link, done: threading.Event) -> None:
        self.src, self.dst, self.link = src, dst, link
        self.q: queue.SimpleQueue[tuple[float, bytes | None]] = queue.SimpleQueue()
        self.done = done
        self.bytes = 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.writer = threading.Thread(target=self._write, daemon=True)

    def start(self) -> None:
        self.reader.start()
        self.writer.start()

    def _read(self) -> None:
        last = 0.0
        try:
            while True:
                data = self.src.recv(_BUF)
                now = time.perf_counter()
                if not data:
                    break
                last = self.link.departure(now, len(data), last)
                self.q.put((last, data))
        except OSError:
            pass
        self.q.put((max(last, time.perf_counter() + self.link.spec.delay_ms / 1e3), None))

    def _write(self) -> None:
        try:
            while True:
                dep, data = self.q.get()
                _sleep_until(dep)
                if data is None:
                    try:
                        self.dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    break
                self.dst.sendall(data)
                self.bytes += len(data)
        except OSError:
            # the destination went away: stop reading the source too
            for s in (self.src, self.dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        finally:
            self.done.set()


class DelayRelay:
    """Listen on ``listen``; forward every connection to ``upstream`` through the delay line.

    ``forward`` applies to client->upstream bytes, ``backward`` to upstream->client;
    by default both get ``spec``.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        spec: LinkSpec,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        *,
        backward: LinkSpec | None = None,
        seed: int | None = 0,
    ) -> None:
        self.upstream = upstream
        self.spec = spec
        self._fwd = _Link(spec, seed)
        self._bwd = _Link(backward or spec, None if seed is None else seed + 1)
        self._sock = socket.create_server(listen, reuse_port=False)
        self._sock.settimeout(0.2)
        self.host, self.port = self._sock.getsockname()[:2]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conns: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self.connections = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> DelayRelay:
        self._thread = threading.Thread(target=self._accept_loop, name="delay-relay", daemon=True)
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            try:
                up = socket.create_connection(self.upstream, timeout=10)
                up.settimeout(None)
            except OSError:
                client.close()  # the client sees a reset, as it would from a dead upstream
                continue
            client.settimeout(None)
            for s in (client, up):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.append((client, up))
                self.connections += 1
            done_a, done_b = threading.Event(), threading.Event()
            _Pipe(client, up, self._fwd, done_a).start()
            _Pipe(up, client, self._bwd, done_b).start()
            threading.Thread(target=self._closer, args=(client, up, done_a, done_b), daemon=True).start()

    def _closer(self, a: socket.socket, b: socket.socket, da: threading.Event, db: threading.Event) -> None:
        da.wait()
        db.wait()
        for s in (a, b):
            try:
                s.close()
            except OSError:
                pass
        with self._lock:
            try:
                self._conns.remove((a, b))
            except ValueError:
                pass

    def stop(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for a, b in conns:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._thread is not None:
            self._thread.join(timeout=2)

    def __enter__(self) -> DelayRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
