"""The silent server's network estimate and floor (pathprobe.loadgen.nullrtt), without a server: the
null round trip is a real sleep of a known length."""

from __future__ import annotations

import time

from pathprobe.loadgen import nullrtt
from pathprobe.loadgen.call import Outcome


def _answer(probe: nullrtt.NullRoundTrip, floor_ms: float | None) -> Outcome:
    out = Outcome(ok=True)
    nullrtt.floor(out, floor_ms)
    probe.apply(out)
    return out


def test_the_floor_is_never_above_the_shortest_null_round_trip() -> None:
    probe = nullrtt.NullRoundTrip(lambda: time.sleep(0.002) is None, idle_s=0.0)
    # handshakes stretched as the process started (50 ms): the null round trips (~2 ms) bound the floor
    out = _answer(probe, 50.0)
    assert out.network_estimate_kind == "http-null-rtt"
    assert 2.0 <= out.network_floor_ms <= out.network_estimate_ms < 50.0
    assert out.network_floor_ms == min(probe.samples.samples)
    # a handshake shorter than any null round trip stays the floor
    assert _answer(probe, 0.03).network_floor_ms == 0.03


def test_without_a_null_round_trip_the_handshake_is_floor_and_estimate() -> None:
    probe = nullrtt.NullRoundTrip(lambda: False, idle_s=0.0)  # the server refuses the null request
    out = _answer(probe, 0.2)
    assert out.network_floor_ms == out.network_estimate_ms == 0.2 and out.network_estimate_kind == "tcp-handshake"
