"""The wire witness's arithmetic and connection matching, on hand-made packets (no processes)."""

from __future__ import annotations

import pytest
from pathprobe.analysis.lab.witness import (
    Chain,
    LinkPorts,
    Packet,
    analyze,
    connection_peers,
    is_stream_tail,
    witness_request,
)

MS = 1_000_000  # ns


def _request(t0: int, *, extra: list[Packet] = ()) -> tuple[dict, list[Packet]]:
    """client -> relay(7000) -> gateway(8000) -> server(9000), times in ms after t0.

    client first packet at +0.3; relay forwards it at +2.3 (2 ms hold); the gateway sends upstream at
    +2.6; the server answers at +3.6; the gateway answers at +3.9; the relay forwards at +5.9; the
    client's timing ends at +6.2."""
    pk = [
        Packet(t0 + int(0.3 * MS), 50001, 7000, 100),  # client -> relay
        Packet(t0 + int(2.3 * MS), 50002, 8000, 100),  # relay -> gateway
        Packet(t0 + int(2.6 * MS), 50003, 9000, 100),  # gateway -> server
        Packet(t0 + int(3.6 * MS), 9000, 50003, 80),  # server -> gateway
        Packet(t0 + int(3.9 * MS), 8000, 50002, 80),  # gateway -> relay
        Packet(t0 + int(5.9 * MS), 7000, 50001, 80),  # relay -> client
        *extra,
    ]
    pk.sort(key=lambda p: p.ts_ns)
    rec = {
        "ok": True,
        "t0_wall_ns": t0,
        "e2e_ms": 6.2,
        "client_encode_ms": 0.1,
        "client_decode_ms": 0.05,
        # gateway: 1.5 ms of its 1.6 ms packet window; upstream call 1.1 ms around a 1.0 ms link window
        # server: 0.9 ms of its 1.0 ms window
        "entries": {"srv.total": 0.9, "gw.upstream": 1.1, "gw.total": 1.5},
        "split": {"network_hop1": 6.2 - 0.15 - 1.5, "network_hop2": 1.1 - 0.9},
    }
    return rec, pk


CHAIN = Chain([LinkPorts([7000, 8000], "gw"), LinkPorts([9000], "srv")])


def test_wire_and_stacks_per_link_add_up_to_the_splits_network():
    rec, pk = _request(10**18)
    w = witness_request(rec, pk, CHAIN)
    l1, l2 = w["links"]
    assert abs(l1["wire"] - 4.0) < 1e-6  # 2 ms held each way by the relay
    assert abs(l1["stack_outer"] - ((0.3 - 0.1) + (6.2 - 5.9 - 0.05))) < 1e-6  # the client's stack
    assert abs(l1["stack_inner"] - (1.6 - 1.5)) < 1e-6  # gateway window 1.6 - gw.total 1.5
    assert abs(l2["wire"]) < 1e-6  # no relay: the same packet on both sides of the link
    assert abs(l2["stack_outer"] - (1.1 - 1.0)) < 1e-6  # gw.upstream 1.1 vs the link's window 1.0
    assert abs(l2["stack_inner"] - (1.0 - 0.9)) < 1e-6
    # the telescoping identity: per link, wire + stacks == the split's network
    assert abs(l1["network"] - rec["split"]["network_hop1"]) < 1e-6
    assert abs(l2["network"] - rec["split"]["network_hop2"]) < 1e-6


def test_another_connection_on_a_shared_port_is_ignored():
    """Another gateway's health check to the same server inside the window must not be taken for it."""
    recs, pkts = [], []
    for i in range(5):
        t0 = 10**18 + i * 50 * MS
        extra = (
            [Packet(t0 + int(1.0 * MS), 40000, 9000, 30), Packet(t0 + int(1.1 * MS), 9000, 40000, 30)] if i == 2 else []
        )
        r, p = _request(t0, extra=extra)
        recs.append(r)
        pkts += p
    pkts.sort(key=lambda p: p.ts_ns)
    windows = [[p for p in pkts if 10**18 + i * 50 * MS <= p.ts_ns < 10**18 + (i + 1) * 50 * MS] for i in range(5)]
    assert connection_peers(windows, [9000])[9000] == 50003
    out = analyze(recs, pkts, CHAIN)
    assert out["matched"] == 5 and out["negative_stacks"] == 0
    assert abs(out["links"][1]["stack_inner"] - 0.1) < 1e-6
    assert [round(x, 6) for x in out["witness_network"]] == [round(x, 6) for x in out["split_network"]]


def test_missing_packets_mean_no_witness_for_that_request():
    rec, pk = _request(10**18)
    assert witness_request(rec, [p for p in pk if p.dport != 9000], CHAIN) is None


@pytest.mark.parametrize(
    "payload,tail",
    [
        (b"e\r\ndata: [DONE]\n\n\r\n", True),  # aiohttp's write of the last event
        (b"0\r\n\r\n", True),  # write_eof
        (b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n", True),  # both in one packet
        (b"data: [DONE]\n\n", True),  # not chunked
        (b'3a\r\ndata: {"token": "x", "server_timing": "srv;dur=1"}\n\n\r\n', False),  # the last timed event
        (b'3a\r\ndata: {"token": "x"}\n\n\r\ne\r\ndata: [DONE]\n\n\r\n', False),  # it and the tail together
        (b"0\r\n\r\nHTTP/1.1 200 OK", False),
        (b"zz\r\n", False),
        (b"", False),
        (b"e\r\ndata: [DONE]\n\n\r\n" * 2000, False),  # a full segment is never a tail (not parsed)
    ],
)
def test_an_event_streams_tail_is_only_done_and_the_last_chunk(payload, tail):
    assert is_stream_tail(payload) is tail


def test_a_response_window_ends_before_the_event_streams_tail():
    """``data: [DONE]`` and the last chunk come after every hop's timing ended: the link's window ends
    at the packet before them (the gateway's upstream side is not below zero), but a response of tail
    packets only still has an end."""
    rec, pk = _request(10**18)
    late = [
        Packet(10**18 + int(3.8 * MS), 9000, 50003, 19, tail=True),  # after the gateway's upstream call ended
        Packet(10**18 + int(3.85 * MS), 9000, 50003, 5, tail=True),
    ]
    w = witness_request(rec, sorted(pk + late, key=lambda p: p.ts_ns), CHAIN)
    assert abs(w["links"][1]["stack_outer"] - (1.1 - 1.0)) < 1e-6  # as without them: 1.1 - 1.25 < 0 if counted
    only = [p for p in pk if p.sport != 9000] + late
    w = witness_request(rec, sorted(only, key=lambda p: p.ts_ns), CHAIN)
    assert w is not None and abs(w["links"][1]["stack_outer"] - (1.1 - 1.25)) < 1e-6
