"""The one rule for a stream's per-chunk costs, on every side (pathprobe.timing, pathprobe.account):
what held the stream's end back counts once, what overlapped the producer's next chunk does not
count again, and time a component spent behind is its own (never the link's, never negative)."""

from __future__ import annotations

import pytest
from pathprobe import timing
from pathprobe.account import account
from pathprobe.segments import SEGMENTS

# the server, direct: 100 ms of engine, its last token ready at 100; the stream's last hand-off 0.2 ms
SERVER = timing.parse_chain(
    "srv.decode;dur=0.1, srv.queue;dur=0.1, srv.decode_steps;dur=100.0, srv.encode;dur=0.05, "
    "srv.send;dur=0.2, srv.backlog;dur=0.0, srv.total;dur=101.0"
)


def test_the_last_hand_off_is_the_links_and_earlier_ones_after_the_producer_the_hops_backlog():
    handoffs = [(1.0, 1.5), (2.0, 2.5), (9.0, 10.0), (10.0, 11.0), (11.0, 11.4)]
    send, backlog = timing.handoff_split(handoffs, 9.5)
    assert send == pytest.approx(0.4)
    assert backlog == pytest.approx(0.5 + 1.0)  # only what lies after the producer's last chunk
    assert timing.handoff_split([], 1.0) == (0.0, 0.0)
    assert send + backlog == pytest.approx(timing.held_back(handoffs, 9.5))


def test_reads_of_a_backlog_are_the_consumers_time_less_its_own_work():
    assert timing.read_backlog(16.0, 10.0, [(10.0, 11.0), (13.0, 14.0)]) == pytest.approx(4.0)
    assert timing.read_backlog(16.0, 16.0, [(16.0, 17.0)]) == 0.0  # it kept up


def test_a_producers_earliest_last_hand_off_is_its_wait_and_total_less_its_last_hand_off():
    assert timing.own_ms("srv.send;dur=0.2, srv.total;dur=101.0") == pytest.approx(100.8)
    # the last hop is the producer (a relay's entries after the server's)
    assert timing.own_ms("srv.total;dur=101.0, gw.upstream;dur=101.5, gw.total;dur=102.0") == pytest.approx(102.0)
    assert timing.own_ms(None) == 0.0
    # its wait before its first timestamp (a saturated front end) came after the request reached it: the
    # last chunk cannot have been handed over before it either
    assert timing.own_ms("srv.wait;dur=30.0, srv.send;dur=0.2, srv.total;dur=101.0") == pytest.approx(130.8)


def _arrivals(n: int, first: float, step: float) -> list[tuple[float, float | None]]:
    """``n`` token chunks the client had at ``first + i * step``; the server emitted them 0.2 ms apart."""
    return [(first + i * step, 1.0 + i * 0.2) for i in range(n)]


def test_a_client_that_keeps_up_counts_only_the_decode_after_the_last_chunk():
    # 500 chunks 0.2 ms apart, each decoded in 0.02 ms right as it arrives: 10 ms of decode in all,
    # all but the last overlapped the server's engine; e2e ends 0.1 ms after the last decode
    arr = _arrivals(500, 1.5, 0.2)
    dec = [(t, t + 0.02) for t, _ in arr]
    e2e = arr[-1][0] + 0.12
    acc = account(e2e, SERVER, client_decode_ms=10.0, stream=True, client_decodes=dec, client_arrivals=arr)
    assert acc.client_decode_ms == pytest.approx(0.02)
    assert acc.decode_overlap_ms == pytest.approx(10.0 - 0.02)
    s = acc.split
    assert sum(getattr(s, k) for k in SEGMENTS) == pytest.approx(e2e)
    assert min(getattr(s, k) for k in SEGMENTS) >= 0 and min(s.links) >= 0
    # before: the whole decode taken out of the link made it -9.6 ms
    old = account(e2e, SERVER, client_decode_ms=10.0, stream=True).split
    assert old.links[0] < -9


def test_a_client_behind_books_its_backlog_as_its_own_not_network():
    # the chunks arrived 0.2 ms apart but the client decoded each in 0.22 ms and read the next 0.03 ms
    # later (never idle: they were waiting): it saw the last one 25 ms late. Its decodes after the
    # last arrival are its serialization, its reads of the waiting chunks its own wait
    arr = [(1.5 + i * 0.25, 1.0 + i * 0.2) for i in range(500)]
    dec = [(t, t + 0.22) for t, _ in arr]
    e2e = arr[-1][0] + 0.3
    acc = account(e2e, SERVER, client_decode_ms=110.0, stream=True, client_decodes=dec, client_arrivals=arr)
    s = acc.split
    assert min(getattr(s, k) for k in SEGMENTS) >= 0 and min(s.links) >= 0
    assert sum(getattr(s, k) for k in SEGMENTS) == pytest.approx(e2e)
    assert s.serialization == pytest.approx(22.0, abs=0.5)  # ~100 decodes after the last arrival
    assert s.client_wait == pytest.approx(3.0, abs=0.2)  # ~100 reads of 0.03 ms
    assert s.network < 1.0  # what is left on the link: its stacks, not the client's backlog


def test_a_client_that_waited_for_the_last_chunks_books_the_stall_as_the_link():
    # the link stalled: the last 10 chunks came 5 ms late, in one burst; the client sat idle for them
    arr = [(1.5 + min(i, 490) * 0.2 + (5.0 + (i - 490) * 0.03 if i >= 490 else 0.0), 1.0 + i * 0.2) for i in range(500)]
    dec = [(t, t + 0.02) for t, _ in arr]
    e2e = arr[-1][0] + 0.12
    s = account(e2e, SERVER, client_decode_ms=10.0, stream=True, client_decodes=dec, client_arrivals=arr).split
    assert s.client_wait < 0.1 and s.serialization < 0.5  # only the burst's nine reads are the client's
    # the stall is the link's, every ms of it: e2e less the burst's ten decodes and reads, the server's own time
    assert s.links[0] == pytest.approx(e2e - 10 * 0.02 - s.client_wait - (101.0 - 0.2))


def test_a_decode_before_the_outer_hop_was_done_is_not_counted_again():
    # a relay that forwarded the last chunk at ~101.3 but its trailers only at 103 (it waited for the
    # server's): the client's slow decode of the last chunks ran inside the relay's total. Counted, it
    # put the client's link at -0.1 ms (seen in CI on a 512-token stream through passthrough: -0.22)
    chain = timing.parse_chain(
        "srv.decode;dur=0.1, srv.queue;dur=0.1, srv.decode_steps;dur=100.0, srv.encode;dur=0.05, srv.send;dur=0.2, "
        "srv.backlog;dur=0.0, srv.total;dur=101.0, gw.upstream;dur=102.9, gw.total;dur=103.0"
    )
    arr = _arrivals(500, 1.5, 0.2)
    dec = [(t, t + (0.3 if i >= 495 else 0.02)) for i, (t, _) in enumerate(arr)]
    e2e = 103.2
    acc = account(e2e, chain, client_decode_ms=11.4, stream=True, client_decodes=dec, client_arrivals=arr)
    assert acc.client_decode_ms == 0.0
    s = acc.split
    assert min(getattr(s, k) for k in SEGMENTS) >= 0 and min(s.links) >= 0
    assert s.links[0] == pytest.approx(e2e - 103.0)


def test_a_gateway_behind_its_server_paces_the_chunks_and_its_offsets_bound_the_last_one():
    # the server emitted 500 chunks 0.04 ms apart; a transcoding gateway fell 100 ms behind and handed
    # them on 0.25 ms apart, its last at 130 ms after its start (the client's 1.0, the link's 2 x 2.5 ms
    # delay after it). The client kept up: it had each chunk 3.5 ms after the gateway handed it on, and
    # decoded it in 0.05 ms. Against the server's offsets the last chunk "arrived" by the first one's
    # bound, ~105 ms early, and the client's wait for the gateway and the link read as its own backlog
    chain = timing.parse_chain(
        "srv.decode;dur=0.1, srv.queue;dur=0.1, srv.decode_steps;dur=0.5, srv.encode;dur=4.0, srv.send;dur=0.1, "
        "srv.backlog;dur=0.0, srv.total;dur=20.0, gw.decode;dur=25.0, gw.backlog;dur=85.0, gw.send;dur=0.1, "
        "gw.upstream;dur=20.5, gw.total;dur=131.0"
    )
    fwd = [5.25 + i * 0.25 for i in range(500)]  # the gateway's hand-offs, ms since its start
    emit = [1.0 + i * 0.04 for i in range(500)]
    seen = [1.0 + 2.5 + f + 1.0 for f in fwd]  # request out (2.5 + stacks), chunk back (2.5 + stacks)
    dec = [(t, t + 0.05) for t in seen]
    e2e = seen[-1] + 0.05 + 2.0  # the trailers after the last chunk
    kw = {"client_decode_ms": 25.0, "stream": True, "client_decodes": dec}
    server_paced = account(e2e, chain, client_arrivals=list(zip(seen, emit, strict=True)), **kw).split
    assert server_paced.client_wait > 2.5  # the link's delay, booked as the client's backlog reads
    for pace in (timing.pacing(emit, fwd, 500), timing.pacing([], fwd, 500)):
        assert pace == fwd
        acc = account(e2e, chain, client_arrivals=list(zip(seen, pace, strict=True)), **kw)
        s = acc.split
        assert s.client_wait == 0.0 and acc.client_decode_ms == pytest.approx(0.05)  # the last chunk's
        assert min(getattr(s, k) for k in SEGMENTS) >= 0 and min(s.links) >= 0
        assert s.links[0] == pytest.approx(e2e - 0.05 - (131.0 - 0.1))  # outside the gateway own time: the link
    assert timing.pacing(emit, [0.0] * 500, 500) == emit  # not every chunk rebuilt: the server's offsets
    assert timing.pacing([0.0] * 500, [], 500) is None


def test_a_consumer_preempted_between_waiting_chunks_was_behind_not_waiting():
    # chunks 0.2 ms apart all waiting in the buffer; the consumer read them with 3 ms gaps now and then
    # (preempted: a time slice on a busy machine). Without its loop's record, each gap looks like a
    # wait for the link; its loop never slept in them, so they are its backlog
    seen = [10.0 + i * 0.05 + (i // 50) * 3.0 for i in range(500)]
    work = [(s, s + 0.04) for s in seen]
    assert timing.last_waited(seen, work) == seen[450]  # the last gap after a multiple of 50
    assert timing.last_waited(seen, work, idle=lambda a, b: False) == -float("inf")
    slept = (seen[449] + 0.1, seen[449] + 2.0)  # the loop slept inside the last gap only
    assert timing.last_waited(seen, work, idle=lambda a, b: slept[1] > a and slept[0] < b) == seen[450]


def test_a_kernel_stamp_puts_the_last_chunk_where_it_arrived_not_where_the_pacing_bounds_it():
    # the client fell behind (0.25 ms per chunk, chunks 0.2 ms apart), and a delaying relay handed the
    # last 10 chunks on 4 ms late, while the client was still reading its backlog: by the pacing the
    # last chunk "arrived" 4 ms earlier than it did, and that time read as the client's backlog. The
    # kernel's receive stamps (pathprobe.rxstamp) say when the bytes came: the 4 ms are the link's
    came = [1.5 + i * 0.2 + (4.0 if i >= 490 else 0.0) for i in range(500)]
    arr = [(1.5 + i * 0.25, 1.0 + i * 0.2) for i in range(500)]
    assert all(s >= c for (s, _), c in zip(arr, came, strict=True))
    dec = [(t, t + 0.22) for t, _ in arr]
    e2e = arr[-1][0] + 0.3
    kw = {"client_decode_ms": 110.0, "stream": True, "client_decodes": dec, "client_arrivals": arr}
    bounded = account(e2e, SERVER, **kw).split
    stamped = account(e2e, SERVER, client_received=came, **kw).split
    for s in (bounded, stamped):
        assert min(getattr(s, k) for k in SEGMENTS) >= 0 and min(s.links) >= 0
        assert sum(getattr(s, k) for k in SEGMENTS) == pytest.approx(e2e)
    assert bounded.links[0] < 1.0  # the relay's 4 ms went to the client
    assert stamped.links[0] == pytest.approx(bounded.links[0] + 4.0, abs=0.3)
    assert stamped.client_wait == pytest.approx(bounded.client_wait - 0.03 / 0.25 * 4.0, abs=0.3)
    # stamps for only some chunks: the bound, as without any
    partial = account(e2e, SERVER, client_received=came[:-1], **kw).split
    assert partial.links[0] == pytest.approx(bounded.links[0])
