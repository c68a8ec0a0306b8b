"""A grpc.aio hop's wait before its handler, from the caller's deadline.

A gRPC front end served by grpc.aio (the server's gRPC port, the reencode gateway) does not see a
call arrive: gRPC's core reads the call's headers on its own threads and holds the call until the
Python side asks for the next one, which it does only when its event loop gets to it. At
saturation that wait is tens of ms, before the handler's first timestamp, so no entry covers it and
the split booked it as network on the link to the hop (:mod:`pathprobe.loopwait` floors a socket's
bytes, but grpc.aio's sockets are not the loop's). What core does record is the call's deadline:
the caller's ``grpc-timeout`` (a duration) anchored when core parsed the headers. So at the
handler's first timestamp, the timeout sent less ``time_remaining()`` is how long the call had
been in this process: its wait (``srv.wait``, ``gw.wait``), the hop's queueing.

The handler must know the exact value sent. gRPC's core rounds the header *up* to three significant
figures of its remaining time at the send (10 s -> 10.0 or 10.1 s, depending on a few us and its
clock), so a caller that wants its wait measured sets a timeout half a step below a three-figure
value (:func:`caller_timeout`: the header then carries that value) and declares it in
:data:`METADATA_KEY`; a client that writes the header itself declares what it wrote. Core keeps
time in whole ms, so the measured wait is off by up to ~1 ms either way: :data:`RESOLUTION_MS` is
taken off it (a wait under it is reported as 0, never guessed), which keeps an idle hop's link
as it was and books a saturated hop's wait less 1 ms. A call without the declaration is not
measured (its wait stays in the link, the safe side).

The margin is half a step: 50 ms for timeouts of 10-100 s (5 ms for 1-10 s). A call that spends
longer than that inside the caller's gRPC library before its headers go out (a first connection
that takes that long) carries a header one step lower than declared, and the wait reads one step
(100 ms) too long; the split caps a hop's wait at its link, so that time moves from the link to the
hop's queueing, never below zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

#: the metadata key a caller declares its ``grpc-timeout`` in (ms, as sent)
METADATA_KEY = "pathprobe-timeout-ms"
#: core's clock resolution (ms): taken off every measured wait
RESOLUTION_MS = 1.0
#: the timeouts whose three-figure steps are at least 10 ms (1 s) up to 1000 s
MIN_MS, MAX_MS = 1000.0, 1_000_000.0


def _step(ms: float) -> float:
    """The three-significant-figure step of a timeout of ``ms`` (ms): 10 ms in [1, 10) s, 100 in [10, 100)."""
    return 10.0 ** (math.floor(math.log10(ms)) - 2)


def caller_timeout(timeout_s: float) -> tuple[float, str | None]:
    """(the timeout to give gRPC, the value to declare in :data:`METADATA_KEY` or None).

    The declared value is ``timeout_s`` rounded down to three significant figures (ms); the timeout
    given is half a step below it, so core's rounding up lands on it exactly. Outside [1, 1000) s
    the timeout is given as it is and nothing is declared."""
    ms = timeout_s * 1000.0
    if not MIN_MS <= ms < MAX_MS:
        return timeout_s, None
    step = _step(ms)
    declared = math.floor(ms / step + 1e-9) * step
    below = _step(declared * (1 - 1e-9))  # a decade's first value: the step just below it
    return (declared - below / 2) / 1000.0, f"{declared:.0f}"


def declared_ms(metadata: Iterable[tuple[str, str | bytes]] | None) -> float | None:
    """The caller's declared timeout (ms), or None when it declared none (or nothing readable)."""
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str):
            try:
                ms = float(value)
            except ValueError:
                return None
            return ms if math.isfinite(ms) and ms > 0 else None
    return None


def wait_ms(declared: float | None, time_remaining_s: float | None) -> float | None:
    """The call's wait before the handler's first timestamp (ms, less :data:`RESOLUTION_MS`, >= 0),
    from the caller's ``declared`` timeout and ``time_remaining()`` read at that timestamp; None
    when either is missing."""
    if declared is None or time_remaining_s is None:
        return None
    return max(0.0, declared - time_remaining_s * 1000.0 - RESOLUTION_MS)


def declare(timeout_s: float | None, metadata: list[tuple[str, str | bytes]]) -> float | None:
    """The timeout to give a gRPC call, with its declaration appended to ``metadata`` (see
    :func:`caller_timeout`); None (no deadline) declares nothing."""
    if timeout_s is None:
        return None
    timeout, declared = caller_timeout(timeout_s)
    if declared is not None:
        metadata.append((METADATA_KEY, declared))
    return timeout
