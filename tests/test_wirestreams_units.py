"""Finding requests by trace id in a capture that lost packets (hand-made pcaps, no processes).

``tcpdump`` drops packets when its buffer fills on a busy machine. A lost segment is a hole in its
connection's bytes: the requests next to it may go unmatched, every other request on the connection
must still be found with the same ends, and none may be given another's (a fresh-clone CI run once
matched none of a gateway's requests after its long-lived upstream channel lost bytes).
"""

from __future__ import annotations

import struct
from decimal import Decimal

import dpkt
import hpack
import pytest
from pathprobe import h2frames
from pathprobe.analysis.lab.wirestreams import requests_by_trace

SERVER, CLIENT = 9000, 50000
MS = 1_000_000


def _trace(i: int) -> str:
    return f"{i + 1:032x}"


def _frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


class _Wire:
    """TCP segments of one connection, with their capture times (1 ms apart) and sequence numbers."""

    def __init__(self) -> None:
        self.segments: list[tuple[int, bool, int, bytes, int]] = []  # (ts, upward, seq, payload, flags)
        self.seq = {True: 1000, False: 5000}
        self.t = 1_700_000_000 * 10**9

    def send(self, upward: bool, payload: bytes, flags: int = dpkt.tcp.TH_ACK) -> int:
        self.t += MS
        self.segments.append((self.t, upward, self.seq[upward], payload, flags))
        self.seq[upward] += len(payload) + (1 if flags & dpkt.tcp.TH_FIN else 0)
        return self.t

    def ack(self, upward: bool) -> None:
        self.send(upward, b"")

    def write(self, path, drop: set[int] = frozenset()) -> None:
        with open(path, "wb") as fh:
            w = dpkt.pcap.Writer(fh, nano=True)
            for i, (ts, upward, seq, payload, flags) in enumerate(self.segments):
                if i in drop:
                    continue
                sport, dport = (CLIENT, SERVER) if upward else (SERVER, CLIENT)
                tcp = dpkt.tcp.TCP(sport=sport, dport=dport, seq=seq, flags=flags, data=payload)
                ip = dpkt.ip.IP(src=b"\x7f\x00\x00\x01", dst=b"\x7f\x00\x00\x01", p=dpkt.ip.IP_PROTO_TCP, data=tcp)
                ip.len = len(bytes(ip))
                w.writepkt(
                    bytes(dpkt.ethernet.Ethernet(type=dpkt.ethernet.ETH_TYPE_IP, data=ip)), ts=Decimal(ts) / 10**9
                )


def _grpc(n: int) -> tuple[_Wire, dict[str, tuple[int, int]], dict[str, list[int]]]:
    """An HTTP/2 connection with ``n`` gRPC calls, two in flight at a time; per call its ends and the
    indexes of its segments."""
    wire, enc = _Wire(), hpack.Encoder()
    ends: dict[str, tuple[int, int]] = {}
    segs: dict[str, list[int]] = {}
    wire.send(True, h2frames.PREFACE + _frame(h2frames.SETTINGS, 0, 0, b""))
    wire.send(False, _frame(h2frames.SETTINGS, 0, 0, b""))
    for pair in range(0, n, 2):
        calls = [i for i in (pair, pair + 1) if i < n]
        for i in calls:
            sid = 2 * i + 1
            headers = [(":method", "POST"), (":path", "/x.Y/Z"), ("traceparent", f"00-{_trace(i)}-{i + 1:016x}-01")]
            start = wire.send(True, _frame(h2frames.HEADERS, h2frames.END_HEADERS, sid, enc.encode(headers)))
            segs[_trace(i)] = [len(wire.segments) - 1]
            wire.send(True, _frame(h2frames.DATA, h2frames.END_STREAM, sid, b"\0\0\0\0\2ab"))
            ends[_trace(i)] = (start, 0)
        for i in calls:  # the two responses' chunks interleave
            for k in range(3):
                wire.send(False, _frame(h2frames.DATA, 0, 2 * i + 1, b"\0\0\0\0\3tok" * (k + 1)))
                segs[_trace(i)].append(len(wire.segments) - 1)
            wire.ack(True)
        for i in calls:
            last = wire.send(
                False, _frame(h2frames.HEADERS, h2frames.END_HEADERS | h2frames.END_STREAM, 2 * i + 1, b"\x88")
            )
            segs[_trace(i)].append(len(wire.segments) - 1)
            ends[_trace(i)] = (ends[_trace(i)][0], last)
    wire.ack(True)
    return wire, ends, segs


def _http1(
    n: int, *, close: bool = True, first: int = 0, wire: _Wire | None = None
) -> tuple[_Wire, dict[str, tuple[int, int]], dict[str, list[int]]]:
    """An HTTP/1.1 keep-alive connection with ``n`` requests (trace ``first`` on), each an event stream in
    four segments; on ``wire`` after what it holds, when given."""
    wire = wire or _Wire()
    ends: dict[str, tuple[int, int]] = {}
    segs: dict[str, list[int]] = {}
    for i in range(first, first + n):
        head = f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntraceparent: 00-{_trace(i)}-{i + 1:016x}-01\r\n"
        start = wire.send(True, (head + "content-length: 2\r\n\r\n{}").encode())
        segs[_trace(i)] = [len(wire.segments) - 1]
        wire.send(False, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        # the last timed event ends the response's window; the event stream's tail after it is no hop's
        last = wire.send(False, b'15\r\ndata: {"timing": 1}\n\n\r\n')
        wire.send(False, b"e\r\ndata: [DONE]\n\n\r\n")
        wire.send(False, b"0\r\n\r\n")
        segs[_trace(i)] += list(range(len(wire.segments) - 4, len(wire.segments)))
        wire.ack(True)
        ends[_trace(i)] = (start, last)
    if close:
        wire.send(True, b"", dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK)
        wire.send(False, b"", dpkt.tcp.TH_FIN | dpkt.tcp.TH_ACK)
        wire.ack(True)
    return wire, ends, segs


def _found(wire: _Wire, tmp_path, drop: set[int] = frozenset()) -> dict[str, tuple[int, int]]:
    path = tmp_path / "c.pcap"
    wire.write(path, drop)
    return {trace: by_port[SERVER] for trace, by_port in requests_by_trace(path, [SERVER]).items()}


@pytest.mark.parametrize("make", [_grpc, _http1], ids=["http2", "http1"])
def test_a_whole_capture_finds_every_request_with_its_ends(make, tmp_path) -> None:
    wire, ends, _ = make(10)
    assert _found(wire, tmp_path) == ends


def test_lost_http2_segments_lose_only_the_calls_they_held(tmp_path) -> None:
    wire, ends, segs = _grpc(12)
    # a response chunk of call 2 (its end is still seen), call 5's HEADERS and call 8's trailers
    drop = {segs[_trace(2)][1], segs[_trace(5)][0], segs[_trace(8)][-1]}
    found = _found(wire, tmp_path, drop)
    assert set(ends) - set(found) == {_trace(5), _trace(8)}
    assert all(found[t] == ends[t] for t in found), "a call after a hole was given other ends"


def test_lost_http1_segments_leave_out_the_requests_next_to_them(tmp_path) -> None:
    wire, ends, segs = _http1(10)
    # request 3's last response segment: seen lost when request 4's response comes, so both are left out
    found = _found(wire, tmp_path, {segs[_trace(3)][-1]})
    assert set(ends) - set(found) == {_trace(3), _trace(4)}
    assert all(found[t] == ends[t] for t in found)


def test_a_loss_at_the_end_of_a_connection_is_seen_from_its_acks(tmp_path) -> None:
    """No data follows the lost last segment; the sender's FIN (a sequence number ahead) shows it."""
    wire, ends, segs = _http1(4)
    found = _found(wire, tmp_path, {segs[_trace(3)][-1]})
    assert set(ends) - set(found) == {_trace(3)}
    assert all(found[t] == ends[t] for t in found)


def test_a_client_port_a_later_connection_reuses_keeps_the_earlier_connections_requests(tmp_path) -> None:
    """Loopback reuses ephemeral ports: a fresh-clone CI run matched none of a concurrency-1 phase's
    556 requests by trace id, because the next phase opened a connection from the same client port
    and the reader let the new connection replace the old one."""
    wire, ends, _ = _http1(3)  # closed with FINs
    wire.seq = {True: 70_000, False: 80_000}  # the new connection's initial sequence numbers
    wire.send(True, b"", dpkt.tcp.TH_SYN)
    wire.send(False, b"", dpkt.tcp.TH_SYN | dpkt.tcp.TH_ACK)
    wire.ack(True)
    wire, later, _ = _http1(3, first=3, wire=wire)
    assert _found(wire, tmp_path) == {**ends, **later}
