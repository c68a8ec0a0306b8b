"""Requests found in a packet capture by their trace id: the wire witness at any concurrency.

At concurrency 1 every packet inside a request's window is that request's (:mod:`.witness`). With
many requests in flight, a request's packets are found by what it carries: its W3C ``traceparent``
(the load generator's client span; every pathprobe hop and our proxy configurations pass the trace
id on). Per listening port, each TCP connection's bytes are put back in order (TCP sequence
numbers) and cut into requests:

- **HTTP/1.1** (one request at a time per connection): a request starts with the client's first
  bytes after the server's last response bytes; its ``traceparent`` header is read from its head.
  Its response ends at its last packet that is not an event stream's tail
  (:func:`.witness.is_stream_tail`: ``data: [DONE]``, the last chunk), as at concurrency 1.
- **HTTP/2** (gRPC): frames are parsed from each direction's byte stream; a stream's request
  starts at the packet that holds the first byte of its first HEADERS frame, whose header block's
  literal values carry the trace id (:func:`pathprobe.h2frames.literal_values`: no HPACK table,
  so a connection opened before the capture still reads); its response ends at the packet that
  holds the last byte of the server's last frame on that stream. On a connection the capture
  joined late (opened before it: a gateway's upstream channel), the first frame boundary is the
  first segment start from which frames chain to the end of the data.

Bytes the capture lost (``tcpdump`` drops packets when its buffer fills on a busy machine) leave a
hole in a direction's stream. Reading resumes after it: HTTP/2 at the first frame boundary of the
bytes after the hole (found as on a late-joined connection), and only a stream whose END_STREAM the
capture holds is given a response end; on HTTP/1.1 the requests next to a hole are left out (their
first or last bytes may be in it). Before, one lost packet on a gateway's long-lived upstream channel
lost every later request on it.

The result, per trace id and port: the request's first packet into the port and the response's last
packet out of it, the two instants :func:`.witness.witness_request` reads per port.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hpack.exceptions import HPACKError
from pathprobe import h2frames
from pathprobe.analysis.lab.witness import is_stream_tail, tcp_segments

#: (first request packet into the port, last response packet out of it), capture clock, ns
Ends = tuple[int, int]

_TRACEPARENT = re.compile(rb"traceparent:\s*[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}", re.IGNORECASE)
_TRACE_VALUE = re.compile(rb"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
#: bytes of an HTTP/1.1 request's head searched for its traceparent
_HEAD = 16384
_FIN, _SYN, _RST = 0x01, 0x02, 0x04  # TCP flags


@dataclass(slots=True)
class _Dir:
    """One direction of a connection: its bytes in order, and the capture instant of each segment."""

    data: bytearray = field(default_factory=bytearray)
    ends: list[int] = field(default_factory=list)  # offset just past each segment's bytes
    stamps: list[int] = field(default_factory=list)  # that segment's capture time
    next_seq: int | None = None
    #: per hole (bytes the capture lost), the index of the first segment after it
    holes: list[int] = field(default_factory=list)

    def add(self, ts_ns: int, seq: int, payload: bytes) -> bool:
        """Append a segment's new bytes; False when it brought none."""
        if not payload:
            return False
        if self.next_seq is None:
            self.next_seq = seq
        self.acked(seq)  # a hole before this segment: read on after it
        behind = (self.next_seq - seq) % (1 << 32)
        if behind >= len(payload):  # a retransmission of bytes already here
            return False
        new = payload[behind:]
        self.data += new
        self.ends.append(len(self.data))
        self.stamps.append(ts_ns)
        self.next_seq = (self.next_seq + len(new)) % (1 << 32)
        return True

    def acked(self, seq: int) -> None:
        """A segment from this direction's sender at ``seq`` (an ACK: the next byte to come; data: its
        first byte): one ahead of ours means lost bytes, even when no data follows them."""
        if self.next_seq is not None:
            ahead = (seq - self.next_seq) % (1 << 32)
            if ahead and ahead < (1 << 31):
                self.holes.append(len(self.ends))
                self.next_seq = seq

    def finished(self, seq: int) -> None:
        """The sender's FIN at ``seq`` (after its data): it takes a sequence number of its own."""
        self.acked(seq)
        if self.next_seq == seq % (1 << 32):
            self.next_seq = (seq + 1) % (1 << 32)

    def stamp(self, offset: int) -> int:
        """The capture time of the segment holding byte ``offset``."""
        return self.stamps[bisect.bisect_right(self.ends, offset)]

    def segment(self, i: int) -> bytes:
        """The new bytes segment ``i`` brought."""
        return bytes(self.data[self.ends[i - 1] if i else 0 : self.ends[i]])

    def runs(self) -> Iterator[tuple[int, int]]:
        """``(start, end)`` offsets of the stretches of bytes without a hole, in order."""
        cuts = [0, *(self.ends[i - 1] for i in self.holes), len(self.data)]
        yield from itertools.pairwise(cuts)


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
    ended: list[_Conn] = []  # connections whose client port a later one reused
    for ts_ns, _ip, tcp in tcp_segments(path):
        upward = tcp.dport in want
        if not upward and tcp.sport not in want:
            continue
        key = (tcp.sport, tcp.dport) if upward else (tcp.dport, tcp.sport)  # (client port, server port)
        if tcp.flags & _SYN and upward and key in conns:
            ended.append(conns.pop(key))  # a new connection on a reused client port: the old one is kept
        conn = conns.setdefault(key, _Conn(key[1]))
        payload, d = bytes(tcp.data), conn.up if upward else conn.down
        if payload and d.add(ts_ns, tcp.seq, payload):
            conn.order.append(upward)
        if tcp.flags & _FIN:
            d.finished(tcp.seq + len(payload))
        elif not payload and not tcp.flags & (_SYN | _RST):  # a SYN takes a sequence number; a RST ends
            d.acked(tcp.seq)
    return ended + list(conns.values())


@dataclass(slots=True)
class _Http1Request:
    head: int  # offset of its first byte in the client's direction
    start: int  # its first packet
    last_out: int | None = None  # the last packet of its response so far
    near_hole: bool = False  # bytes next to it were lost: its first or last packet may be unknown


def _http1(conn: _Conn) -> Iterator[tuple[str, Ends]]:
    """(trace id, ends) per HTTP/1.1 request of a connection (no pipelining: one at a time)."""
    up, down = conn.up, conn.down
    up_holes, down_holes = set(up.holes), set(down.holes)
    ui = di = 0  # next segment of each direction, walked in capture order
    found: list[_Http1Request] = []
    for upward in conn.order:
        if upward:
            if not found or found[-1].last_out is not None:
                found.append(_Http1Request(up.ends[ui - 1] if ui else 0, up.stamps[ui]))
            hole = ui in up_holes
            ui += 1
        else:
            if found and (found[-1].last_out is None or not is_stream_tail(down.segment(di))):
                found[-1].last_out = down.stamps[di]
            hole = di in down_holes
            di += 1
        if hole:  # the lost bytes were the current request's or the one's before it
            for req in found[-2:]:
                req.near_hole = True
    if found and (len(up.ends) in up_holes or len(down.ends) in down_holes):  # lost at the end
        found[-1].near_hole = True
    for req in found:
        if req.last_out is not None and not req.near_hole:
            yield from _http1_request(up, req.head, req.start, req.last_out)


def _http1_request(up: _Dir, offset: int, start: int, last_out: int) -> Iterator[tuple[str, Ends]]:
    m = _TRACEPARENT.search(bytes(up.data[offset : offset + _HEAD]))
    if m:
        yield m.group(1).decode().lower(), (start, last_out)


#: segments tried as a connection's first frame boundary when the capture joined it late
_SYNC_TRIES = 64
#: HTTP/2's default SETTINGS_MAX_FRAME_SIZE (what gRPC's core sends)
_MAX_FRAME = 16384


def _frame_start(d: _Dir, buf: bytearray, start: int) -> int | None:
    """The offset of the first frame boundary in ``buf[start:]`` (``d``'s bytes up to a hole or their
    end): past the preface when the capture saw the connection open; else the first segment start from
    which frames chain to the end of ``buf`` (valid types, no frame over it; a wrong start fails within
    a few frames)."""
    if start == 0 and buf.startswith(h2frames.PREFACE):
        return len(h2frames.PREFACE)
    end, first = len(buf), bisect.bisect_right(d.ends, start)
    for off in [start, *(e for e in d.ends[first : first + _SYNC_TRIES - 1] if e < end)]:
        pos, n = off, 0
        for _, stop, ftype, _flags, _sid in h2frames.frames(buf, off):
            if ftype > h2frames.CONTINUATION:
                break
            pos, n = stop, n + 1
        else:  # chained to the end, or to a last frame the capture did not see whole
            if pos == end > off or (n >= 3 and end - pos <= 9 + _MAX_FRAME):
                return off
    return None


def _frames(d: _Dir) -> Iterator[tuple[int, int, int, int, int]]:
    """:func:`pathprobe.h2frames.frames` of a direction, stretch by stretch between the capture's
    holes, each from its first frame boundary."""
    for start, end in d.runs():
        buf = d.data if end == len(d.data) else d.data[:end]
        first = _frame_start(d, buf, start)
        if first is not None:
            yield from h2frames.frames(buf, first)


def _looks_h2(conn: _Conn) -> bool:
    return conn.up.data.startswith(h2frames.PREFACE) or not conn.up.data[:16].split(b" ", 1)[0].isalpha()


def _http2(conn: _Conn) -> Iterator[tuple[str, Ends]]:
    """(trace id, ends) per HTTP/2 stream of a connection."""
    up, down = conn.up, conn.down
    firsts: dict[int, tuple[int, str | None]] = {}  # stream -> (first HEADERS packet, trace id)
    block: dict[int, bytearray] = {}  # a header block still open (CONTINUATION to come)
    for start, end, ftype, flags, sid in _frames(up):
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
    # a stream's response ends with its END_STREAM's header block (or a reset): whatever the capture
    # lost before it, that is its last frame
    lasts: dict[int, int] = {}
    closing: set[int] = set()  # END_STREAM seen on a header block still open
    for _, end, ftype, flags, sid in _frames(down):
        if not sid or sid in lasts:
            continue
        if ftype in (h2frames.DATA, h2frames.HEADERS) and flags & h2frames.END_STREAM:
            closing.add(sid)
        if ftype == h2frames.RST_STREAM or (
            sid in closing and (ftype == h2frames.DATA or flags & h2frames.END_HEADERS)
        ):
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
