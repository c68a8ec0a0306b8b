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
    entries = {
        "srv.decode": 0.1,
        "srv.queue": 2.0,
        "srv.tokenize": 0.3,
        "srv.prefill": 5.0,
        "srv.decode_steps": 20.0,
        "srv.detokenize": 0.4,
        "srv.encode": 0.2,
        "srv.total": 29.0,
    }
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


SRV = "srv.decode;dur=0.100, srv.queue;dur=2.000, srv.prefill;dur=5.000, srv.encode;dur=0.200, srv.total;dur=10.000"


def test_parse_chain_keeps_every_hop_apart_in_append_order() -> None:
    inner = timing.append(SRV, {"gw.decode": 0.3, "gw.upstream": 11.0, "gw.encode": 0.4, "gw.total": 12.5})
    outer = timing.append(inner, {"gw.decode": 0.05, "gw.upstream": 13.0, "gw.encode": 0.06, "gw.total": 13.5})
    chain = timing.parse_chain(outer + ', nginx.upstream;dur=14.2, nginx.total;dur=14.4;desc="edge"')
    assert [h.kind for h in chain.hops] == ["srv", "gw", "gw", "nginx"]
    assert [h.get("total") for h in chain.hops] == [10.0, 12.5, 13.5, 14.4]
    assert chain.hops[1].get("decode") == 0.3 and chain.hops[2].get("decode") == 0.05
    assert chain.hops[3].desc == "edge" and chain.hops[3].label == "nginx (edge)"
    # the merged view is what parse() gives: a repeated name keeps the last hop's value
    assert dict(chain) == timing.parse(outer + ', nginx.upstream;dur=14.2, nginx.total;dur=14.4;desc="edge"')
    # repeated header values are read in order too
    assert timing.parse_chain([SRV, "gw.upstream;dur=11, gw.total;dur=12"]).hops[1].get("upstream") == 11.0


def test_split_of_a_chain_books_each_link_and_keeps_each_hops_serialization() -> None:
    st = timing.append(SRV, {"gw.decode": 0.3, "gw.upstream": 11.0, "gw.encode": 0.4, "gw.total": 12.5})
    st = timing.append(st, {"gw.decode": 0.05, "gw.upstream": 13.0, "gw.encode": 0.06, "gw.total": 13.5})
    s = split(15.0, timing.parse_chain(st), client_encode_ms=0.1, client_decode_ms=0.2)
    assert s.links == pytest.approx((15.0 - 0.3 - 13.5, 13.0 - 12.5, 11.0 - 10.0))
    assert s.network == pytest.approx(sum(s.links))
    assert s.network_hop1 == pytest.approx(1.2) and s.network_hop2 == pytest.approx(1.5)
    assert s.serialization == pytest.approx(0.3 + 0.11 + 0.7 + 0.3)
    assert [h.other for h in s.hops] == pytest.approx([13.5 - 13.0 - 0.11, 12.5 - 11.0 - 0.7, 10.0 - 0.3 - 2.0 - 5.0])
    assert s.unsplit == 0.0 and not s.network_estimated
    assert sum(getattr(s, name) for name in SEGMENTS) == pytest.approx(15.0)


def test_a_streaming_hops_send_waits_are_the_link_towards_its_client() -> None:
    # a stream: the server waited 0.9 ms on its transport for the chunks, the gateway 0.4 ms on its
    # client's; those are the links' stack time (as a unary answer's hand-off after .total), not
    # the hops' own, and a gateway's never lands in the link behind it
    srv = SRV.replace("srv.total", "srv.send;dur=0.900, srv.total")
    st = timing.append(srv, {"gw.decode": 0.3, "gw.upstream": 11.0, "gw.encode": 0.4, "gw.send": 0.4, "gw.total": 12.5})
    s = split(15.0, timing.parse_chain(st), client_encode_ms=0.1, client_decode_ms=0.2)
    assert s.links == pytest.approx((15.0 - 0.3 - 12.5 + 0.4, 11.0 - 10.0 + 0.9))
    assert [h.other for h in s.hops] == pytest.approx([12.5 - 11.0 - 0.7 - 0.4, 10.0 - 0.3 - 2.0 - 5.0 - 0.9])
    assert s.serialization == pytest.approx(0.3 + 0.7 + 0.3)
    assert sum(getattr(s, name) for name in SEGMENTS) == pytest.approx(15.0)
    # without the send entries (unary, or a hop that does not report them) nothing changes
    plain = split(15.0, timing.parse_chain(timing.append(SRV, {"gw.upstream": 11.0, "gw.total": 12.5})))
    assert plain.links == pytest.approx((2.5, 1.0))


def test_silent_server_is_unsplit_never_network() -> None:
    # direct to a server that reports nothing: nothing is guessed
    s = split(21.0, {}, client_encode_ms=0.4, client_decode_ms=0.6)
    assert s.network == 0.0 and s.unsplit == pytest.approx(20.0) and s.links == (0.0,)
    # with a measured transport round trip, that much is network, labelled as estimated
    s = split(21.0, {}, 0.4, 0.6, network_estimate_ms=0.25)
    assert s.network == pytest.approx(0.25) and s.unsplit == pytest.approx(19.75) and s.network_estimated
    # behind a reporting gateway: its upstream time holds the silent server and the last link
    s = split(21.0, timing.parse_chain("gw.decode;dur=0.2, gw.upstream;dur=18.0, gw.total;dur=19.0"), 0.4, 0.6)
    assert s.links == pytest.approx((1.0, 0.0)) and s.unsplit == pytest.approx(18.0)
    assert s.other == pytest.approx(0.8) and s.serialization == pytest.approx(1.2)
    for sp in (s, split(5.0, {}, network_estimate_ms=9.0)):
        assert sum(getattr(sp, name) for name in SEGMENTS) == pytest.approx(sp.e2e)
        assert sp.unsplit >= 0.0


def test_hop_that_reports_only_its_total_keeps_what_it_forwarded_unsplit() -> None:
    # e.g. a proxy that reports how long it took, but not its upstream's share
    s = split(30.0, timing.parse_chain("litellm.total;dur=25.0"), 0.5, 0.5)
    assert s.links == pytest.approx((4.0,)) and s.unsplit == pytest.approx(25.0) and s.other == 0.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8000", ("127.0.0.1", 8000)),
        ("[::1]:9000", ("::1", 9000)),
        ("grpc://10.1.2.3:50051", ("10.1.2.3", 50051)),
        ("http://example.internal:80/v1", ("example.internal", 80)),
    ],
)
def test_one_address_parser(value: str, expected: tuple[str, int]) -> None:
    from pathprobe.address import parse_hostport

    assert parse_hostport(value, "--x") == expected


@pytest.mark.parametrize("value", ["nohost", "h:", "h:port", "h:70000", ":80"])
def test_address_parser_names_the_flag(value: str) -> None:
    from pathprobe.address import parse_hostport
    from pathprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="^--upstream: expected HOST:PORT"):
        parse_hostport(value, "--upstream")


def test_a_streams_handoff_counts_only_what_held_the_stream_back():
    """srv.send: the waits on chunk sends while the engine was still producing tokens are the
    engine's time (already in srv.decode_steps); only what lies after its last token was ready
    held the stream's end back."""
    from pathprobe.timing import held_back

    # tokens ready at 10, 12, 14; sends quick: only the last wait (14.1-14.4) counts
    assert held_back([(10.0, 10.3), (12.0, 12.3), (14.1, 14.4)], 14.0) == pytest.approx(0.3)
    # a slow transport: a backlog drains after the last token (ready at 14): 14..20 counts, once
    assert held_back([(10.0, 13.0), (13.1, 17.0), (17.1, 20.0)], 14.0) == pytest.approx(3.0 + 2.9)
    assert held_back([], 0.0) == 0.0


def _sums(s) -> float:
    return sum(getattr(s, k) for k in SEGMENTS)


def test_nginx_figures_are_brought_within_its_clock_resolution() -> None:
    """nginx reports whole ms from a clock it caches per loop turn: its total can exceed what the client
    saw, its upstream its own total, by up to 1 ms (2048-token streams: client link -0.44, nginx's own
    -1.0). Within that, its figures give way to the precise ones; beyond it, or on a precise hop, the
    contradiction is left to be seen."""
    # total 80 > the client's 79.944; upstream 79 >= the server's 77.68
    s = split(79.944, timing.parse_chain("srv.total;dur=77.680, nginx.upstream;dur=79, nginx.total;dur=80"))
    assert s.links[0] == 0.0 and s.links[1] == pytest.approx(79.0 - 77.68)
    assert all(h.other >= 0 for h in s.hops) and _sums(s) == pytest.approx(79.944)
    # upstream 52 > total 51 (own -1): the upstream gives way, not below the server's total
    s = split(52.5, timing.parse_chain("srv.total;dur=50.200, nginx.upstream;dur=52, nginx.total;dur=51"))
    nginx = next(h for h in s.hops if h.label.startswith("nginx"))
    assert nginx.other == 0.0 and s.links == pytest.approx((1.5, 0.8)) and _sums(s) == pytest.approx(52.5)
    # upstream 50 < the server's 50.4: the link below would be -0.4; raised to it
    s = split(52.0, timing.parse_chain("srv.total;dur=50.400, nginx.upstream;dur=50, nginx.total;dur=51"))
    assert s.links == pytest.approx((1.0, 0.0)) and all(h.other >= 0 for h in s.hops)
    # beyond the resolution: left (a broken report, not a coarse clock)
    s = split(51.0, timing.parse_chain("srv.total;dur=50, nginx.upstream;dur=51, nginx.total;dur=53"))
    assert s.links[0] == pytest.approx(-2.0)
    # a precise hop's figures are never moved
    s = split(79.944, timing.parse_chain("srv.total;dur=77.680, gw.upstream;dur=79, gw.total;dur=80"))
    assert s.links[0] == pytest.approx(-0.056)


def test_a_servers_wait_for_its_body_is_link_time_in_front_of_hops_that_stream_it() -> None:
    """``srv.body`` (the server's wait for its request body's bytes, inside its total) is network: on the
    link to the server, or, behind hops that forward bodies as they come (nginx's grpc_pass, HAProxy), on
    a link the body crossed: the outermost, unless one inside took more than 3x its own time (flow
    control holds a body for round trips of the slow link); never the server's own time."""
    server = "srv.decode;dur=1, srv.body;dur=5, srv.total;dur=20"
    # direct: the client's link carried it
    s = split(23.0, timing.parse_chain(server))
    assert s.links == pytest.approx((8.0,)) and s.hops[0].other == pytest.approx(14.0) and _sums(s) == 23.0
    # behind nginx's grpc_pass, the client link the slower (4 ms against 2): the client link's
    nginx = "nginx.upstream;dur=22, nginx.total;dur=23;desc=grpc_pass"
    s = split(27.0, timing.parse_chain(f"{server}, {nginx}"))
    assert s.links == pytest.approx((9.0, 2.0)) and s.hops[1].other == pytest.approx(14.0)
    assert _sums(s) == pytest.approx(27.0)
    # ... as slow as the server link (2 and 2): still the client link's (these proxies take a body
    # through a small window: the client's link paces it)
    s = split(25.0, timing.parse_chain(f"{server}, {nginx}"))
    assert s.links == pytest.approx((7.0, 2.0))
    # ... the server link more than 3x as slow (0.5 against 2): the server link held it back
    s = split(23.5, timing.parse_chain(f"{server}, {nginx}"))
    assert s.links == pytest.approx((0.5, 7.0))
    # ... 2.5x (0.8 against 2): the client link's
    s = split(23.8, timing.parse_chain(f"{server}, {nginx}"))
    assert s.links == pytest.approx((5.8, 2.0))
    # behind a hop that buffers the body (nginx's proxy_pass, a pathprobe gateway): the server link's
    for outer in ("nginx.upstream;dur=22, nginx.total;dur=23;desc=proxy_pass", "gw.upstream;dur=22, gw.total;dur=23"):
        s = split(27.0, timing.parse_chain(f"{server}, {outer}"))
        assert s.links == pytest.approx((4.0, 7.0)), outer
    # through HAProxy behind a gateway: only as far out as the hops that stream it
    chain = f"{server}, haproxy.upstream;dur=22, haproxy.total;dur=23, gw.upstream;dur=27, gw.total;dur=28"
    s = split(38.0, timing.parse_chain(chain))
    assert s.links == pytest.approx((10.0, 9.0, 2.0))  # not the slowest (10): the gateway had the whole body
    # never more than the link holds: a body wait beyond it (a broken report) moves only what is there
    s = split(28.0, timing.parse_chain(f"srv.body;dur=5, srv.total;dur=22, nginx.upstream;dur=24, {nginx}"))
    assert min(s.links) >= 0 and _sums(s) == pytest.approx(28.0)


def test_nginx_total_is_raised_to_its_inner_hops_within_its_resolution() -> None:
    """A server that counts its body's arrival starts at the headers, as nginx's upstream call does: its
    total can exceed nginx's whole-ms figures by less than 1 ms (a 16k prompt: srv 20.11, nginx 20 and 20)."""
    s = split(26.2, timing.parse_chain("srv.total;dur=20.11, nginx.upstream;dur=20, nginx.total;dur=20;desc=grpc_pass"))
    assert s.links == pytest.approx((6.09, 0.0)) and s.hops[0].other == 0.0 and _sums(s) == pytest.approx(26.2)
    s = split(
        28.5, timing.parse_chain("srv.total;dur=22.107, nginx.upstream;dur=23, nginx.total;dur=22;desc=grpc_pass")
    )
    assert s.links == pytest.approx((28.5 - 22.107, 0.0)) and s.hops[0].other == 0.0
    # not past the client's side: the client saw 20.05, so nginx's total stays where it is (left to be seen)
    s = split(20.05, timing.parse_chain("srv.total;dur=20.11, nginx.upstream;dur=20, nginx.total;dur=20"))
    assert s.hops[0].other < 0
