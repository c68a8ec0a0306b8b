"""The relay's frame iterator and header-block reader against the hpack library's own encoder."""

from __future__ import annotations

import pytest
from hpack import Decoder, Encoder
from hpack.exceptions import HPACKError
from hypothesis import given, settings
from hypothesis import strategies as st
from pathprobe.h2frames import DATA, HEADERS, PATH, STATUS, BlockReader, frame, frames, literal

NAMES = [
    b":path",
    b"grpc-status",
    b"grpc-message",
    b"server-timing",
    b"grpc-timeout",
    b"content-type",
    b"te",
    b"x-custom",
    b"traceparent",
]
header = st.tuples(st.sampled_from(NAMES), st.binary(min_size=0, max_size=40).map(lambda b: b.hex().encode()))
block_spec = st.tuples(st.lists(header, min_size=1, max_size=8), st.booleans(), st.booleans())


def test_frames_yields_whole_frames_and_stops_at_a_partial_one() -> None:
    buf = bytearray(frame(HEADERS, 4, 1, b"abc") + frame(DATA, 1, 0x7FFFFFFF, b"x" * 300) + frame(DATA, 0, 3, b"yy"))
    whole = len(buf) - 2
    got = list(frames(buf[:whole]))
    assert [(f[2], f[3], f[4]) for f in got] == [(HEADERS, 4, 1), (DATA, 1, 0x7FFFFFFF)]
    assert got[-1][1] == len(buf) - 11  # the third frame (9 + 2 bytes) is cut: left for the next read
    assert [f[4] for f in frames(buf)] == [1, 0x7FFFFFFF, 3]
    assert list(frames(bytearray(b"\x00\x00"))) == []


def test_reserved_bit_of_the_stream_id_is_ignored() -> None:
    raw = bytearray(frame(DATA, 0, 5, b""))
    raw[5] |= 0x80
    assert next(frames(raw))[4] == 5


WANTED = (PATH, STATUS, frozenset({b"x-custom", b"server-timing"}), frozenset(NAMES))


@settings(max_examples=200, deadline=None)
@given(st.lists(block_spec, min_size=1, max_size=12))
def test_reader_matches_a_full_decode_and_keeps_the_table_in_step(blocks: list) -> None:
    """Blocks from hpack's encoder (indexing, Huffman) mixed with the relay's own literals: on
    every block the reader returns what a full decode returns for the wanted names, so its
    table stays in step whichever path (scan or decode) each earlier block took."""
    enc, ref, reader = Encoder(), Decoder(), BlockReader()
    for i, (headers, huffman, add_literal) in enumerate(blocks):
        block = enc.encode(headers, huffman=huffman)
        if add_literal:
            block += literal(b"server-timing", b"gw.total;dur=0.100")
        wanted = WANTED[i % len(WANTED)]
        full = ref.decode(block, raw=True)
        assert reader.read(block, wanted) == {k: v for k, v in full if k in wanted}
    assert list(reader.dec.header_table.dynamic_entries) == list(ref.header_table.dynamic_entries)


def test_table_size_updates_and_evictions_stay_in_step() -> None:
    enc, ref, reader = Encoder(), Decoder(), BlockReader()
    ref.max_allowed_table_size = reader.dec.max_allowed_table_size
    for i in range(60):
        if i in (10, 30):
            enc.header_table_size = 256 if i == 10 else 4096  # the next block starts with a size update
        block = enc.encode(
            [
                (b"date", f"Tue, 01 Dec 2026 15:00:{i:02d} GMT".encode()),
                (b"grpc-status", b"0"),
                (b":path", f"/svc/M{i % 7}".encode()),
            ]
        )
        full = ref.decode(block, raw=True)
        assert reader.read(block, PATH | STATUS) == {k: v for k, v in full if k in PATH | STATUS}
    assert list(reader.dec.header_table.dynamic_entries) == list(ref.header_table.dynamic_entries)


@pytest.mark.parametrize(
    "block",
    [
        b"\x80",
        b"\xff\xff\xff\xff",
        b"\x00\x05ab",
        b"\x0f",
        b"\xbf",
        b"\x40\x85ab",
        b"\x82\x3f\xe1\x1f",
        b"\x3f\xff\xff\xff\x7f",
    ],
)
def test_malformed_blocks_raise_hpack_errors(block: bytes) -> None:
    with pytest.raises(HPACKError):
        BlockReader().read(block, STATUS)


def _lit(value: bytes) -> bytes:
    assert len(value) < 127
    return bytes((len(value),)) + value


# Blocks as nginx writes responses: static-table references and literals with incremental indexing
# (a static name, or a new one), so the same bytes come again; now and then a block that refers to
# the dynamic table or shrinks it (those are never replayed from memory).
static_field = st.one_of(
    st.sampled_from([b"\x88", b"\x8d"]),  # :status 200 / 204, indexed
    st.tuples(st.sampled_from([33, 54, 31]), st.binary(max_size=12)).map(  # date / server / content-type
        lambda t: bytes((0x40 | t[0],)) + _lit(t[1].hex().encode())
    ),
    st.tuples(st.sampled_from([b"grpc-status", b"server-timing"]), st.sampled_from([b"0", b"14", b"x"])).map(
        lambda t: b"\x40" + _lit(t[0]) + _lit(t[1])
    ),
    st.sampled_from([b"grpc-message", b"x-custom"]).map(lambda n: b"\x00" + _lit(n) + _lit(b"v")),
)
static_block = st.lists(static_field, min_size=1, max_size=5).map(b"".join)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(static_block, min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["same", "dynamic", "shrink"])), min_size=1, max_size=30),
)
def test_repeated_static_blocks_are_replayed_in_step(pool: list, steps: list) -> None:
    """A block seen before is replayed from memory (its adds, its fields); the table, evictions
    included, must stay what hpack's decoder makes of the same blocks."""
    ref, reader = Decoder(), BlockReader()
    for n, (i, kind) in enumerate(steps):
        block = pool[i % len(pool)]
        if kind == "dynamic" and ref.header_table.dynamic_entries:
            block = b"\xbe" + block  # the newest dynamic entry, then the static block
        elif kind == "shrink" and n % 3 == 0:
            block = b"\x3f\xe1\x01" + block  # table size update to 256: evictions from here on
        wanted = WANTED[n % len(WANTED)] | {b"date", b"server", b"grpc-status"}
        full = ref.decode(block, raw=True)
        assert reader.read_pairs(block, wanted) == [(k, v) for k, v in full if k in wanted]
        assert list(reader.dec.header_table.dynamic_entries) == list(ref.header_table.dynamic_entries)
