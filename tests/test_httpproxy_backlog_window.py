"""Ground truth for http-proxy behind on a stream: its lateness is its own, not the server link's network.

An HTTP upstream (tests/support/burst_sse_http.py) writes a whole stream at once, so the gateway is
behind from the start and works through the events out of aiohttp's buffer. Left without a turn of
its event loop meanwhile, nothing read the upstream socket: its receive buffer filled, the kernel
closed the TCP window, and the rest of the stream waited in the upstream's send buffer until the
gateway had caught up. The kernel's stamp of the last bytes' arrival then dated the gateway's own
lateness, and the split booked it as the server link's network (2048-token streams from our server
on loopback: up to 7.7 ms at the p90). The upstream's answer left it at once: the link's share of
``gw.upstream`` is the stacks' size; the gateway's catching up is ``gw.backlog``.
"""

from __future__ import annotations

from pathlib import Path

from pathprobe import timing

from tests.support.clients import http_post, sse_events
from tests.support.procs import fake_upstream_behind

#: ~200 KB of SSE: more than a fresh loopback socket's receive buffer takes (128 KB), less than
#: aiohttp's own buffer limit (512 KB), beyond which it stops reading the socket on purpose
EVENTS = 3000


def _stream(url: str) -> list[object]:
    status, _, body = http_post(url, {"prompt": "hello", "max_tokens": EVENTS, "stream": True})
    assert status == 200, body[:300]
    return sse_events(body)


def test_catching_up_is_the_gateways_not_the_links(tmp_path: Path) -> None:
    up = ("tests.support.burst_sse_http", "--events", str(EVENTS))
    with fake_upstream_behind(tmp_path, "http-proxy", *up) as url:
        runs = [_stream(f"{url}/v1/generate") for _ in range(9)]
    links = []
    for events in runs:
        assert events[-1] == "[DONE]"
        chunks = [e for e in events if isinstance(e, dict)]
        assert len(chunks) == EVENTS
        chain = timing.parse_chain(chunks[-1]["server_timing"])
        srv, gw_hop = chain.hops[0], chain.hops[-1]
        where = {k: round(v, 2) for k, v in gw_hop.entries.items()}
        # the gateway was behind: its catching up is booked as its own
        assert gw_hop.get("backlog") > 5.0, where
        links.append((gw_hop.get("upstream") - srv.get("total"), where))
    # the link's share: the request's trip and the answer's on loopback, the stamp's 1 ms slack included
    # (1.5-2.5 ms here). Before, the gateway's catching up on what its socket had taken when the window
    # closed: the 7th of 9 runs 8.6-10.0 ms, the median 4.3-4.7 (and 1.9-2.0 with it, 1.6-1.7)
    links.sort(key=lambda x: x[0])
    assert links[6][0] < 4.0, links
    assert all(link >= 0.0 for link, _ in links), links
