"""Requests found in a packet capture by their trace id: the wire witness at any concurrency.

At concurrency 1 every packet inside a request's window is that request's (:mod:`.witness`). With
many requests in flight, a request's packets are found by what it carries: its W3C ``traceparent``
(the load generator's client span; every pathprobe hop and our proxy configurations pass the trace
id on). Per listening port, each TCP connection's bytes are put back in order (TCP sequence
numbers) and cut into requests:

- **HTTP/1.1** (one request at a time per connection): a request starts with the client's first
  bytes after the server's last response bytes; its ``traceparent`` header is read from its head.
- **HTTP/2** (gRPC): frames are parsed from each direction's byte stream; a stream's request
  starts at the packet that holds the first byte of its first HEADERS frame, whose header block's
  literal values carry the trace id (:func:`pathprobe.h2frames.literal_values`: no HPACK table,
  so a connection opened before the capture still reads); its response ends at the packet that
  holds the last byte of the server's last frame on that stream. On a connection the capture
  joined late (opened before it: a gateway's upstream channel), the first frame boundary is the
  first segment start from which frames chain to the end of the data.

The result, per trace id and port: the request's first packet into the port and the response's last
packet out of it, the two instants :func:`.witness.witness_request` reads per port.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hpack.exceptions import HPACKError
from pathprobe import h2frames
from pathprobe.analysis.lab.witness import tcp_segments

#: (first request packet into the port, last response packet out of it), capture clock, ns
Ends = tuple[int, int]

_TRACEPARENT = re.compile(rb"traceparent:\s*[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}", re.IGNORECASE)
_TRACE_VALUE = re.compile(rb"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
#: bytes of an HTTP/1.1 request's head searched for its traceparent
_HEAD = 16384
_SYN = 0x02  # the TCP flag


@dataclass(slots=True)
class _Dir:
    """One direction of a connection: its bytes in order, and the capture instant of each segment."""

    data: bytearray = field(default_factory=bytearray)
    ends: list[int] = field(default_factory=list)  # offset just past each segment's bytes
    stamps: list[int] = field(default_factory=list)  # that segment's capture time
    next_seq: int | None = None
    broken: bool = False  # a gap: bytes the capture lost; nothing after it is read

    def add(self, ts_ns: int, seq: int, payload: bytes) -> bool:
        """Append a segment's new bytes; False when it brought none (or follows a hole)."""
        if self.broken or not payload:
            return False
        if self.next_seq is None:
            self.next_seq = seq
        ahead = (seq - self.next_seq) % (1 << 32)
        if ahead and ahead < (1 << 31):  # a hole before this segment
            self.broken = True
            return False
        behind = (self.next_seq - seq) % (1 << 32)
        if behind >= len(payload):  # a retransmission of bytes already here
            return False
        new = payload[behind:]
        self.data += new
        self.ends.append(len(self.data))
        self.stamps.append(ts_ns)
        self.next_seq = (self.next_seq + len(new)) % (1 << 32)
        return True

    def stamp(self, offset: int) -> int:
        """The capture time of the segment holding byte ``offset``."""
        return self.stamps[bisect.bisect_right(self.ends, offset)]


@dataclass(slots=True)
class _Conn:
    port: int  # the listening side's
    up: _Dir = field(default_factory=_Dir)  # client -> server
    down: _Dir = field(default_factory=_Dir)  # server -> client
    order: list[bool] = field(default_factory=list)  # per data segment, capture order: client->server?


def read_connections(path: Path, ports: Iterable[int]) -> list[_Conn]:
    """Every TCP connection to one of ``ports`` in a pcap, each direction's bytes in order."""
    want = set(ports)
    conns: dict[tuple[int, int], _Conn] = {}
    for ts_ns, _ip, tcp in tcp_segments(path):
        upward = tcp.dport in want
        if not upward and tcp.sport not in want:
            continue
        key = (tcp.sport, tcp.dport) if upward else (tcp.dport, tcp.sport)  # (client port, server port)
        if tcp.flags & _SYN and upward:
            conns.pop(key, None)  # a new connection on a reused client port
        conn = conns.setdefault(key, _Conn(key[1]))
        payload = bytes(tcp.data)
        if payload and (conn.up if upward else conn.down).add(ts_ns, tcp.seq, payload):
            conn.order.append(upward)
    return list(conns.values())


def _http1(conn: _Conn) -> Iterator[tuple[str, Ends]]:
    """(trace id, ends) per HTTP/1.1 request of a connection (no pipelining: one at a time)."""
    up, down = conn.up, conn.down
    ui = di = 0  # next segment of each direction, walked in capture order
    start: int | None = None  # the current request's first packet
    head_from = 0
    last_out: int | None = None
    replied = False
    for upward in conn.order:
        if upward:
            ts = up.stamps[ui]
            if start is None or replied:
                if start is not None and last_out is not None:
                    yield from _http1_request(up, head_from, start, last_out)
                start, replied, last_out = ts, False, None
                head_from = up.ends[ui - 1] if ui else 0
            ui += 1
        else:
            last_out, replied = down.stamps[di], True
            di += 1
    if start is not None and last_out is not None:
        yield from _http1_request(up, head_from, start, last_out)


def _http1_request(up: _Dir, offset: int, start: int, last_out: int) -> Iterator[tuple[str, Ends]]:
    m = _TRACEPARENT.search(bytes(up.data[offset : offset + _HEAD]))
    if m:
        yield m.group(1).decode().lower(), (start, last_out)


#: segments tried as a connection's first frame boundary when the capture joined it late
_SYNC_TRIES = 64
#: HTTP/2's default SETTINGS_MAX_FRAME_SIZE (what gRPC's core sends)
_MAX_FRAME = 16384


def _frame_start(d: _Dir) -> int | None:
    """The offset of the first frame boundary in one direction's bytes: past the preface when the
    capture saw the connection open; else the first segment start from which frames chain to the end
    of the data (valid types, no frame over the data; a wrong start fails within a few frames)."""
    if d.data.startswith(h2frames.PREFACE):
        return len(h2frames.PREFACE)
    for off in [0, *d.ends[: _SYNC_TRIES - 1]]:
        pos, n = off, 0
        for _, end, ftype, _flags, _sid in h2frames.frames(d.data, off):
            if ftype > h2frames.CONTINUATION:
                break
            pos, n = end, n + 1
        else:  # chained to the end, or to a last frame the capture did not see whole
            if pos == len(d.data) > off or (n >= 3 and len(d.data) - pos <= 9 + _MAX_FRAME):
                return off
    return None


def _looks_h2(conn: _Conn) -> bool:
    return conn.up.data.startswith(h2frames.PREFACE) or not conn.up.data[:16].split(b" ", 1)[0].isalpha()


def _http2(conn: _Conn) -> Iterator[tuple[str, Ends]]:
    """(trace id, ends) per HTTP/2 stream of a connection."""
    up, down = conn.up, conn.down
    first_up, first_down = _frame_start(up), _frame_start(down)
    if first_up is None or first_down is None:
        return
    firsts: dict[int, tuple[int, str | None]] = {}  # stream -> (first HEADERS packet, trace id)
    block: dict[int, bytearray] = {}  # a header block still open (CONTINUATION to come)
    for start, end, ftype, flags, sid in h2frames.frames(up.data, first_up):
        if ftype == h2frames.HEADERS and sid not in firsts:
            firsts[sid] = (up.stamp(start), None)
            _, frag = h2frames.fragment(flags, bytes(up.data[start + 9 : end]))
            block[sid] = bytearray(frag)
        elif ftype == h2frames.CONTINUATION and sid in block:
            block[sid] += up.data[start + 9 : end]
        else:
            continue
        if flags & h2frames.END_HEADERS:
            firsts[sid] = (firsts[sid][0], _trace_in_block(bytes(block.pop(sid))))
    lasts: dict[int, int] = {}
    for _, end, ftype, _flags, sid in h2frames.frames(down.data, first_down):
        if sid and ftype in (h2frames.DATA, h2frames.HEADERS, h2frames.CONTINUATION, h2frames.RST_STREAM):
            lasts[sid] = down.stamp(end - 1)
    for sid, (first, trace) in firsts.items():
        if trace and sid in lasts:
            yield trace, (first, lasts[sid])


def _trace_in_block(block: bytes) -> str | None:
    try:
        for value in h2frames.literal_values(block):
            m = _TRACE_VALUE.match(value)
            if m:
                return m.group(1).decode().lower()
    except (HPACKError, IndexError):
        return None
    return None


def requests_by_trace(path: Path, ports: Iterable[int]) -> dict[str, dict[int, Ends]]:
    """Trace id -> port -> (first request packet in, last response packet out), for every request on
    ``ports`` whose trace id its packets carry. A trace seen twice on one port keeps its first."""
    out: dict[str, dict[int, Ends]] = {}
    for conn in read_connections(path, ports):
        found = _http2(conn) if _looks_h2(conn) else _http1(conn)
        for trace, ends in found:
            out.setdefault(trace, {}).setdefault(conn.port, ends)
    return out
