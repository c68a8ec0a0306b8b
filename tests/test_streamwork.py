"""A gateway's per-chunk work: only what lay after the upstream's last chunk arrived held the
stream's end back (pathprobe.gateway.streamwork), whether the gateway kept up or fell behind."""

from __future__ import annotations

import pytest
from pathprobe.gateway.streamwork import STAMP_SLACK_MS, StreamWork


def _work(seen: list[tuple[float, float | None]], cost: float) -> StreamWork:
    """Chunks seen at the given instants, each decoded, encoded and sent in ``cost`` ms apiece."""
    w = StreamWork()
    for t, emit in seen:
        w.chunk(t, emit)
        w.decode.append((t, t + cost))
        w.encode.append((t + cost, t + 2 * cost))
        w.send.append((t + 2 * cost, t + 3 * cost))
    return w


def test_a_gateway_that_keeps_up_counts_only_the_last_chunks_work():
    # the upstream emits every 2 ms and the gateway sees each chunk 1 ms later: it keeps up
    w = _work([(11.0, 10.0), (13.0, 12.0), (15.0, 14.0)], 0.1)
    assert w.last_arrival() == pytest.approx(15.0)
    assert w.held() == pytest.approx((0.1, 0.1, 0.1, 0.0))
    assert w.spent() == pytest.approx((0.3, 0.3, 0.3))


def test_a_gateway_behind_its_upstream_counts_its_backlog():
    # the upstream emitted three chunks 0.1 ms apart; the gateway took 3 ms per chunk, so the last
    # chunk waited in the buffer from 10.2 on and it was seen only at 16
    w = _work([(10.0, 1.0), (13.0, 1.1), (16.0, 1.2)], 1.0)
    assert w.last_arrival() == pytest.approx(10.2)
    dec, enc, send, backlog = w.held()
    # everything after 10.2: most of chunk 1's decode, its encode and send, and all of chunks 2 and 3;
    # of the sends, the last one's is the client link's, the two before it the gateway's backlog
    assert dec == pytest.approx(2.8) and enc == pytest.approx(3.0)
    assert send == pytest.approx(1.0) and backlog == pytest.approx(2.0)


def test_a_gateway_behind_books_its_reads_of_the_waiting_chunks_as_its_backlog():
    # the same upstream; the gateway's work is 1.5 ms a chunk and it got to the next chunk 0.05 ms
    # after each (never idle: the chunks were waiting), reading them is its backlog too
    w = _work([(10.0, 1.0), (11.55, 1.1), (13.1, 1.2)], 0.5)
    dec, enc, send, backlog = w.held()
    assert dec == pytest.approx(1.3) and enc == pytest.approx(1.5) and send == pytest.approx(0.5)
    assert backlog == pytest.approx(1.0 + 0.1)  # two sends before the last one, and the two reads
    # every part lies after the last chunk's arrival and before the gateway was done with it
    assert dec + enc + send + backlog <= 14.6 - w.last_arrival() + 1e-9


def test_a_gateway_that_waited_for_a_chunk_had_it_when_it_came():
    # a jittered link: chunks 1 and 2 came at once 1 ms after their emit, chunk 3 after a 3 ms stall;
    # the emit offsets alone would put its arrival at 13.0, but the gateway sat idle until 16: it was
    # waiting for it (the stall is the link's), not behind
    w = _work([(11.0, 10.0), (12.5, 12.0), (16.0, 14.0)], 0.1)
    assert w.last_arrival() == pytest.approx(14.5)  # the emit-offset bound alone
    assert w.held() == pytest.approx((0.1, 0.1, 0.1, 0.0))
    assert w.last == pytest.approx(16.0)


def test_the_arrival_is_never_before_the_upstream_was_done():
    # the last chunk was handed over late by its producer (its loop busy): 1.5 ms from its emit, where
    # the others took 1 ms; the upstream reports it was done 15.4 ms after the call started at 0
    w = _work([(11.0, 10.0), (13.0, 12.0), (15.5, 14.0)], 0.1)
    assert w.last_arrival() == pytest.approx(15.0)
    assert w.last_arrival(not_before=15.4) == pytest.approx(15.4)
    assert w.last_arrival(not_before=99.0) == pytest.approx(15.5)  # never after the gateway had it
    assert w.held(not_before=15.4)[0] == pytest.approx(0.1)


def test_the_chunk_with_the_least_link_delay_bounds_the_arrival():
    # chunk 2 came over the link faster (0.5 ms) than chunks 1 and 3 (1 ms): it bounds the last one
    w = _work([(11.0, 10.0), (12.5, 12.0), (15.0, 14.0)], 0.1)
    assert w.last_arrival() == pytest.approx(14.5)


def test_without_emit_offsets_the_last_chunk_arrives_when_seen():
    for emits in ([None, None, None], [0.0, 0.0, 0.0], [1.0, None, None]):
        w = _work([(10.0, emits[0]), (13.0, emits[1]), (16.0, emits[2])], 1.0)
        assert w.last_arrival() == 16.0, emits
    assert StreamWork().held() == (0.0, 0.0, 0.0, 0.0)


def test_a_gateway_that_read_every_chunk_late_has_its_lateness_by_the_kernels_stamp():
    # at c=32 the loop reads each of this stream's chunks ~20 ms after it came (busy with the others):
    # uniformly late, so the pacing bound sees no backlog and the 20 ms stayed on the server link. The
    # kernel's stamps (pathprobe.rxstamp) say when the bytes came: beyond the slack, the gateway's own
    seen = [(30.0 + 2 * i, 10.0 + 2 * i) for i in range(5)]  # emitted 2 ms apart, each seen 20 ms after it came
    plain = _work(seen, 0.1)
    assert plain.held()[3] == pytest.approx(0.0)  # no backlog: the lateness was the link's
    w = StreamWork()
    for (t, emit), came in zip(seen, [10.5 + 2 * i for i in range(5)], strict=True):
        w.chunk(t, emit, arrived_ms=came)
        w.decode.append((t, t + 0.1))
        w.encode.append((t + 0.1, t + 0.2))
        w.send.append((t + 0.2, t + 0.3))
    _, _, send, backlog = w.held()
    assert w.last == pytest.approx(18.5 + STAMP_SLACK_MS)
    # from there to the last chunk's read, less the work on the four chunks before it (their hand-offs
    # after that instant are backlog too)
    assert send == pytest.approx(0.1) and backlog == pytest.approx(38.0 - 18.5 - STAMP_SLACK_MS - 4 * 0.2)
    # a read within the slack of its stamp (an idle loop's wake-up) leaves the bound as it was
    quick = _work(seen, 0.1)
    quick.arrived = [t - 0.3 for t, _ in seen]
    assert quick.held() == pytest.approx(plain.held())
    # never before the upstream was done
    w.held(not_before=30.0)
    assert w.last == pytest.approx(30.0)


def test_a_last_chunk_the_upstream_held_back_arrives_at_its_stamp_not_at_the_pacing_bound():
    # chunks emitted 1 ms apart and each read 0.2 ms after its bytes came; the last came 3 ms later than
    # its emit offset says (the upstream held it back: its own srv.backlog) while the gateway was still
    # handing the chunk before to its client (a slow client transport: that overlapped the upstream).
    # The pacing bound puts the last chunk's arrival 3 ms early and books that hand-off as held back
    # (the gateway's upstream side then shorter than the packets' window); the kernel's stamp says
    # when it came
    emits, came = [1.0, 2.0, 3.0, 4.0], [10.0, 11.0, 12.0, 16.0]

    def work(stamped: bool) -> StreamWork:
        w = StreamWork()
        for e, a in zip(emits, came, strict=True):
            w.chunk(a + 0.2, e, arrived_ms=a if stamped else None)
            w.decode.append((a + 0.2, a + 0.3))
            w.encode.append((a + 0.3, a + 0.4))
            w.send.append((a + 0.4, 15.9 if a == 12.0 else a + 0.5))
        return w

    plain = work(stamped=False)
    assert plain.held()[3] == pytest.approx(3.0) and plain.last == pytest.approx(13.2)
    w = work(stamped=True)
    decode, encode, send, backlog = w.held()
    assert w.last == pytest.approx(16.2)  # read within the slack of its stamp: seen, the wake-up the link's
    assert (decode, encode, send, backlog) == pytest.approx((0.1, 0.1, 0.1, 0.0))
