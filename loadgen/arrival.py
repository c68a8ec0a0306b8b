"""Open-loop arrivals: intended send times at a constant or Poisson rate, with a ramp.

All users of a process draw their next intended send time from one :class:`Schedule`;
a user sleeps until that time and sends. When every user is busy the intended times
keep advancing, so the lag between intended and actual send grows and is recorded
(coordinated omission is measured instead of hidden). Latency is reported from the
intended send time; the segment split stays on the actual service time.
"""

from __future__ import annotations

import math
import random
import time


class Schedule:
    """Intended send times (``perf_counter_ns``) for ``rate`` req/s, ramped over ``ramp_s``.

    With a linear ramp from 0 to R over T seconds the expected number of arrivals by
    time t is R t^2 / (2T) (t <= T), then R T / 2 + R (t - T). Arrival k happens when that
    count reaches k (constant) or the k-th point of a unit-rate Poisson process
    (Poisson, by time change), so both modes share one inversion.
    """

    def __init__(
        self, rate: float, kind: str = "constant", ramp_s: float = 0.0, seed: int = 0, start_ns: int | None = None
    ) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        if kind not in ("constant", "poisson"):
            raise ValueError(f"unknown arrival kind {kind!r}")
        self.rate = rate
        self.kind = kind
        self.ramp_s = max(0.0, ramp_s)
        self._rng = random.Random(seed)
        self._count = 0.0  # position in "expected arrivals" units
        self.start_ns = start_ns if start_ns is not None else time.perf_counter_ns()
        self.issued = 0

    def _time_of(self, k: float) -> float:
        """Seconds after start at which the expected arrival count reaches k."""
        r, ramp = self.rate, self.ramp_s
        if ramp > 0:
            ramp_count = r * ramp / 2.0
            if k <= ramp_count:
                return math.sqrt(2.0 * k * ramp / r)
            return ramp + (k - ramp_count) / r
        return k / r

    def next_ns(self) -> int:
        if self.kind == "poisson":
            self._count += self._rng.expovariate(1.0)
        else:
            self._count += 1.0
        self.issued += 1
        return self.start_ns + int(self._time_of(self._count) * 1e9)
