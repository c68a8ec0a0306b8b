from __future__ import annotations

import pytest

from pathprobe import timing
from pathprobe.segments import SEGMENTS, split


def test_format_parse_roundtrip() -> None:
    entries = {"srv.decode": 0.0123, "srv.total": 12.5}
    text = timing.format_entries(entries)
    assert text == "srv.decode;dur=0.012, srv.total;dur=12.500"
    assert timing.parse(text) == {"srv.decode": 0.012, "srv.total": 12.5}


def test_parse_tolerates_other_params_and_missing_dur() -> None:
    assert timing.parse('cache;desc="hit", db;dur=53;desc=x, , app;dur=4.5') == {"cache": 0.0, "db": 53.0, "app": 4.5}
    assert timing.parse(None) == {}


def test_append_keeps_upstream_and_adds_own() -> None:
    out = timing.append("srv.total;dur=2.000", {"gw.total": 3.0})
    assert timing.parse(out) == {"srv.total": 2.0, "gw.total": 3.0}
    assert timing.append(None, {"gw.total": 1.0}) == "gw.total;dur=1.000"


@pytest.mark.parametrize("via_gateway", [False, True])
def test_split_adds_up_to_e2e(via_gateway: bool) -> None:
    entries = {"srv.decode": 0.1, "srv.queue": 2.0, "srv.tokenize": 0.3, "srv.prefill": 5.0,
               "srv.decode_steps": 20.0, "srv.detokenize": 0.4, "srv.encode": 0.2, "srv.total": 29.0}
    if via_gateway:
        entries |= {"gw.decode": 0.5, "gw.encode": 0.6, "gw.upstream": 30.5, "gw.total": 32.0}
    s = split(35.0, entries, client_encode_ms=0.05, client_decode_ms=0.07)
    assert sum(getattr(s, name) for name in SEGMENTS) == pytest.approx(35.0)
    assert s.queueing == 2.0
    assert s.inference == pytest.approx(25.7)
    if via_gateway:
        assert s.network_hop1 == pytest.approx(35.0 - 0.12 - 32.0)
        assert s.network_hop2 == pytest.approx(1.5)
        assert s.serialization == pytest.approx(0.12 + 1.1 + 0.3)
        assert s.other == pytest.approx((32.0 - 30.5 - 1.1) + (29.0 - 0.3 - 2.0 - 25.7))
    else:
        assert s.network_hop2 == 0.0
        assert s.network == pytest.approx(35.0 - 0.12 - 29.0)
