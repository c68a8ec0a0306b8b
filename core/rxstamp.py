"""When the bytes a read returned reached this host: the kernel's receive timestamp.

What the client knows of a response's arrival is when it read it. Two of its own figures need when
the bytes came instead. Its wait for its own event loop (:mod:`pathprobe.loadgen.clientwait`) is an
upper bound: the busy stretch before the resume that delivered the response's end, of which the
response was readable only from some instant on; when the client process loses its core inside
that stretch, the stretch holds the whole preemption. And a stream's last chunk's arrival, when the
client was behind, is bounded from the pacing of the chunks before it (:func:`pathprobe.timing.last_arrival`),
which assumes the last one crossed the path as quickly as the quickest did; a delaying relay that
hands it on late breaks that. Either way the link's own time was booked as the client's: a delayed
client link behind http-proxy, 512-token streams, moved by 1.0 ms or less for 5 in one pair in ten
(2026-12-03), the delayed call's client wait 3.9-4.4 ms against 0.5 in its undelayed twin.

With ``SO_TIMESTAMPNS`` (Linux) the kernel stamps every received segment, and ``recvmsg`` returns the
stamp of the last segment a read copied: when that read's last byte arrived. A socket that gives no
stamp (TLS, another OS) reads as before, without one.

A gateway on asyncio reads its upstream through the loop's transport, which calls ``recv`` on its
socket; :func:`stamp_transport` puts a :class:`StampedSocket` there (asyncio's selector transports
keep the socket in ``_sock``: a private name, guarded, like :mod:`pathprobe.loopwait`'s look at the
selector), so the gateway knows when the bytes of each chunk it reads had reached the host, whatever
its loop was doing then.
"""

from __future__ import annotations

import socket
import struct
import time
from collections import deque
from typing import Any

#: ``SO_TIMESTAMPNS`` (Python does not name it; its value on Linux' generic and x86 ABIs)
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TS = struct.Struct("qq")  # struct timespec: seconds, nanoseconds (CLOCK_REALTIME)
_ANC = socket.CMSG_SPACE(_TS.size)
#: the sends a :class:`StampedSocket` remembers (one request's head and body at a time)
SENDS_KEPT = 8


def enable(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what ``sock`` receives; False where it cannot (then read plainly)."""
    if not hasattr(sock, "recvmsg"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def recv(sock: socket.socket, n: int) -> tuple[bytes, int, int | None]:
    """One read of at most ``n`` bytes: the bytes, when the read returned and when its last byte had
    arrived (``time.perf_counter_ns``; None without a stamp; never after the return)."""
    data, anc, _flags, _addr = sock.recvmsg(n, _ANC)
    return (data, *_arrival(anc))


class Reads:
    """A blocking socket's reads, stamped where the kernel can: when the last one returned (``read_at``)
    and when its last byte had arrived (``arrived_at``; ``perf_counter_ns``; None: no stamp, or no read
    since :meth:`forget`). The load generator's HTTP/1.1 and HTTP/2 clients each keep one."""

    __slots__ = ("arrived_at", "read_at", "stamped")

    def __init__(self) -> None:
        self.stamped = False
        self.read_at = 0
        self.arrived_at: int | None = None

    def start(self, sock: socket.socket, can: bool = True) -> None:
        """A new connection: stamp what it receives where ``can`` (not TLS) and the kernel allows."""
        self.stamped = can and enable(sock)

    def recv(self, sock: socket.socket, n: int) -> bytes:
        if self.stamped:
            data, self.read_at, self.arrived_at = recv(sock, n)
        else:
            data, self.read_at = sock.recv(n), time.perf_counter_ns()
        return data

    def forget(self) -> None:
        """A new request: no read of its answer yet."""
        self.arrived_at = None

    @property
    def age_ms(self) -> float | None:
        """How long the last read's bytes had waited in the kernel when it returned (ms); None: unknown."""
        return age_ms(self.read_at, self.arrived_at)


def age_ms(read_at: int, arrived_at: int | None) -> float | None:
    """How long a read's bytes had waited in the kernel when it returned (ms); None without a stamp."""
    return None if arrived_at is None else (read_at - arrived_at) / 1e6


def _arrival(ancillary: list[tuple[int, int, bytes]]) -> tuple[int, int | None]:
    """Now, and when the read's last byte arrived by the stamp in ``ancillary`` (``perf_counter_ns``;
    None without one; never after now)."""
    now_pc, now_wall = time.perf_counter_ns(), time.time_ns()
    stamp = wall_stamp(ancillary)
    return now_pc, None if stamp is None else now_pc - max(now_wall - stamp, 0)


def wall_stamp(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The receive stamp in ``ancillary`` (ns, CLOCK_REALTIME); None without one."""
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= _TS.size:
            sec, nsec = _TS.unpack_from(raw)
            return int(sec) * 1_000_000_000 + int(nsec)
    return None


class StampedSocket:
    """A socket whose ``recv`` / ``recv_into`` read with the kernel's stamp: ``arrived`` is when the
    last read's last byte reached the host (``time.perf_counter_ns``; None: none yet, or no stamp);
    and whose last few ``send`` calls are timed (:meth:`sent_after`). Everything else is the socket's."""

    __slots__ = ("_sends", "_sock", "arrived")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.arrived: int | None = None
        self._sends: deque[int] = deque(maxlen=SENDS_KEPT)

    def send(self, data: Any, flags: int = 0) -> int:
        self._sends.append(time.perf_counter_ns())
        return self._sock.send(data, flags)

    def sent_after(self, t_ns: int) -> int | None:
        """When the first ``send`` at or after ``t_ns`` began (``perf_counter_ns``); None: none kept."""
        return next((t for t in self._sends if t >= t_ns), None)

    def recv(self, n: int, flags: int = 0) -> bytes:
        if flags:
            return self._sock.recv(n, flags)
        data, _, self.arrived = recv(self._sock, n)
        return data

    def recv_into(self, buf: Any, nbytes: int = 0, flags: int = 0) -> int:
        if flags:
            return self._sock.recv_into(buf, nbytes, flags)
        n, anc, _flags, _addr = self._sock.recvmsg_into([memoryview(buf)[: nbytes or None]], _ANC)
        _, self.arrived = _arrival(anc)
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def arrived_ms(stamped: StampedSocket | None) -> float | None:
    """When a stamped socket's last read had its bytes (``timing.now_ms``'s clock); None: not stamped."""
    return None if stamped is None or stamped.arrived is None else stamped.arrived / 1e6


def stamp_transport(transport: object) -> StampedSocket | None:
    """Stamp what ``transport`` (an asyncio selector transport over TCP) reads from now on; the same
    wrapper again when it already is; None where it cannot (another transport, TLS, no stamps)."""
    sock = getattr(transport, "_sock", None)
    if isinstance(sock, StampedSocket):
        return sock
    if not isinstance(sock, socket.socket) or sock.type != socket.SOCK_STREAM or not enable(sock):
        return None
    stamped = StampedSocket(sock)
    transport._sock = stamped  # type: ignore[attr-defined]
    return stamped
