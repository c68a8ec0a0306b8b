"""HTTP/2 frames and HPACK header blocks, the small part of HTTP/2 that gRPC needs.

Shared by the gateway's frame relay and the load generator's gRPC client: one frame iterator
(:func:`frames`), frame and literal-header builders that touch no HPACK table, and
:class:`BlockReader`, which keeps one direction's HPACK table in step and returns only the
fields asked for. The table, integer and Huffman codecs are the ``hpack`` library's.
"""

from __future__ import annotations

from collections.abc import Iterator

from hpack import Decoder
from hpack.exceptions import HPACKDecodingError
from hpack.hpack import decode_integer
from hpack.huffman_table import decode_huffman

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, END_HEADERS, PADDED, F_PRIORITY = 0x1, 0x4, 0x8, 0x20
# SETTINGS identifiers (RFC 9113 section 6.5.2)
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS, S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE = 1, 2, 3, 4, 5


def _int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """HPACK 'literal header field without indexing, new name', no Huffman: touches no table."""
    return b"\x00" + _int(len(name), 7, 0) + name + _int(len(value), 7, 0) + value


def literal_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(literal(k, v) for k, v in headers)


def frame(ftype: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big") + payload


class FrameError(Exception):
    """A frame the relay cannot pass on (RFC 9113 connection error); ``code`` is the h2 error code."""

    def __init__(self, message: str, code: int = 1) -> None:  # 1 = PROTOCOL_ERROR
        super().__init__(message)
        self.code = code


def fragment(flags: int, payload: bytes) -> tuple[bytes, bytes]:
    """(priority prefix, header block fragment) of a HEADERS payload, padding removed.

    Raises FrameError for a pad length or priority block the frame does not hold."""
    start, end = 0, len(payload)
    if flags & PADDED:
        if not payload:
            raise FrameError("HEADERS: PADDED without a pad length")
        end -= payload[0]
        start = 1
    prio = b""
    if flags & F_PRIORITY:
        prio = payload[start : start + 5]
        start += 5
    if start > end:
        raise FrameError("HEADERS: padding or priority longer than the frame")
    return prio, payload[start:end]


def frames(buf: bytearray, pos: int = 0) -> Iterator[tuple[int, int, int, int, int]]:
    """Every whole frame in ``buf`` from ``pos``: ``(start, end, type, flags, stream id)``.

    The one place frame headers are parsed; a partial frame at the end is left for the next read.
    """
    n = len(buf)
    while n - pos >= 9:
        end = pos + 9 + ((buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2])
        if end > n:
            return
        yield (
            pos,
            end,
            buf[pos + 3],
            buf[pos + 4],
            ((buf[pos + 5] & 0x7F) << 24) | (buf[pos + 6] << 16) | (buf[pos + 7] << 8) | buf[pos + 8],
        )
        pos = end


class BlockReader:
    """Reads the fields the relay needs from one direction's header blocks.

    Every block of a connection must pass through here, in order, so the HPACK dynamic table
    stays in step. The table, integer and Huffman codecs are the ``hpack`` library's; the walk
    over a block is the relay's own so that only the wanted fields are materialised (``hpack``'s
    ``Decoder.decode`` builds and logs a tuple per field: about 40 % of the relay's CPU per call),
    and Huffman-coded strings are decoded once per distinct string (an upstream that re-sends
    ``date``/``server`` with incremental indexing sends the same bytes again and again).

    A block that refers to no dynamic-table entry and changes no table size has the same effect
    whatever the table holds: the fields it adds, in order, and the same wanted fields. Such a
    block is walked once; when the same bytes come again (nginx and other servers that index
    ``date``/``server`` on every response send identical blocks for a second at a time) its adds
    are replayed into the table (evictions happen there as usual) and its fields returned.
    """

    HUFFMAN_CACHE = 512
    BLOCK_CACHE = 256

    def __init__(self) -> None:
        self.dec = Decoder()
        self.dec.max_allowed_table_size = 1 << 20
        self._huff: dict[bytes, bytes] = {}
        #: (block, wanted) -> (fields it adds to the table, wanted fields) for static-only blocks
        self._blocks: dict[
            tuple[bytes, frozenset[bytes]], tuple[tuple[tuple[bytes, bytes], ...], tuple[tuple[bytes, bytes], ...]]
        ] = {}

    def decode_all(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """Every field, by ``hpack``'s own decoder (tracing rewrites whole blocks)."""
        return [(k, v) for k, v in self.dec.decode(block, raw=True)]

    def read(self, block: bytes, wanted: frozenset[bytes]) -> dict[bytes, bytes]:
        """The wanted fields of ``block`` (last one wins); raises ``HPACKError`` when malformed."""
        return dict(self.read_pairs(block, wanted))

    def read_pairs(self, block: bytes, wanted: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
        """The wanted fields of ``block`` in order, repeats kept (``server-timing`` may come twice)."""
        table = self.dec.header_table
        key = (block, wanted)
        seen = self._blocks.get(key)
        if seen is not None:
            for name, value in seen[0]:
                table.add(name, value)
            return list(seen[1])
        out: list[tuple[bytes, bytes]] = []
        adds: list[tuple[bytes, bytes]] = []
        static = True  # no dynamic-table reference, no size update so far
        i, n = 0, len(block)
        while i < n:
            b = block[i]
            if b & 0x80:  # indexed field
                if b != 0xFF:
                    idx, i = b & 0x7F, i + 1
                else:
                    idx, used = decode_integer(block[i:], 7)
                    i += used
                if idx == 0:
                    raise HPACKDecodingError("indexed header field with index 0")
                if idx > _STATIC:
                    static = False
                pair = table.get_by_index(idx)
                if pair[0] in wanted:
                    out.append(pair)
                continue
            if b & 0xE0 == 0x20:  # dynamic table size update
                if out or i:
                    raise HPACKDecodingError("table size update after a header field")
                size, used = decode_integer(block[i:], 5)
                if size > self.dec.max_allowed_table_size:
                    raise HPACKDecodingError(f"table size update to {size}, over the allowed size")
                self.dec.header_table_size = size
                static = False
                i += used
                continue
            indexing = b & 0x40  # literal with incremental indexing, else without / never indexed
            bits = 6 if indexing else 4
            mask = (1 << bits) - 1
            if b & mask == mask:
                idx, used = decode_integer(block[i:], bits)
                i += used
            else:
                idx, i = b & mask, i + 1
            if idx:
                if idx > _STATIC:
                    static = False
                name = table.get_by_index(idx)[0]
            else:
                name, i = self._string(block, i)
            if indexing or name in wanted:
                value, i = self._string(block, i)
                if indexing:
                    table.add(name, value)
                    adds.append((name, value))
                if name in wanted:
                    out.append((name, value))
            else:
                i = _skip_string(block, i)
        if static:
            if len(self._blocks) >= self.BLOCK_CACHE:
                self._blocks.clear()
            self._blocks[key] = (tuple(adds), tuple(out))
        return out

    def _string(self, block: bytes, i: int) -> tuple[bytes, int]:
        b = block[i]
        if b & 0x7F != 0x7F:
            length, start = b & 0x7F, i + 1
        else:
            length, used = decode_integer(block[i:], 7)
            start = i + used
        end = start + length
        if end > len(block):
            raise HPACKDecodingError("string literal runs past the header block")
        raw = block[start:end]
        if not b & 0x80:
            return raw, end
        value = self._huff.get(raw)
        if value is None:
            if len(self._huff) >= self.HUFFMAN_CACHE:
                self._huff.clear()
            value = self._huff[raw] = decode_huffman(raw)
        return value, end


def literal_values(block: bytes) -> Iterator[bytes]:
    """Every literal value of a header block, Huffman-decoded, without an HPACK table.

    The walk needs no table: indexed fields are skipped, a literal's name (indexed or not) is not
    resolved. What a request carries new on every call (a ``traceparent``) is always a literal, so
    a reader that joined a connection late (a packet capture) still finds it. Raises
    ``HPACKDecodingError`` when the block is malformed."""
    i, n = 0, len(block)
    while i < n:
        b = block[i]
        if b & 0x80:  # indexed field
            i += decode_integer(block[i:], 7)[1]
            continue
        if b & 0xE0 == 0x20:  # dynamic table size update
            i += decode_integer(block[i:], 5)[1]
            continue
        bits = 6 if b & 0x40 else 4
        idx, used = decode_integer(block[i:], bits)
        i += used
        if not idx:
            i = _skip_string(block, i)
        start = i
        i = _skip_string(block, i)
        raw_start = start + decode_integer(block[start:], 7)[1]
        raw = block[raw_start:i]
        yield decode_huffman(raw) if block[start] & 0x80 else raw


def _skip_string(block: bytes, i: int) -> int:
    b = block[i]
    if b & 0x7F != 0x7F:
        end = i + 1 + (b & 0x7F)
    else:
        length, used = decode_integer(block[i:], 7)
        end = i + used + length
    if end > len(block):
        raise HPACKDecodingError("string literal runs past the header block")
    return end


#: entries in HPACK's static table (RFC 7541 appendix A); a higher index is the dynamic table's
_STATIC = 61
PATH = frozenset((b":path",))
STATUS = frozenset((b"grpc-status",))
NOTHING: frozenset[bytes] = frozenset()
