"""The wire witness on a real run: ``pathprobe compare --witness pcap`` with a known relay delay.

A passthrough gateway four times: a delaying relay with D = 0 and with D on its upstream link,
and the same on its client link. At concurrency 1 every request's packets are matched; per link
the witness's wire + stacks agree with the in-band split's network within max(5%, 0.2 ms), and the
delay appears as WIRE time on the delayed link only (packet to packet, the capture's clock, no
application timestamp involved): 2 x D over its D = 0 twin, plus the relay's sleep overshoot.
Needs root and tcpdump; about 60 s.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support.compare import run_compare

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump is not installed"),
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="packet capture needs root"),
]

D_UP, D_CLIENT = 3.0, 2.0


def _config(out, targets, *, tracing=False, decode_ms=0.0, concurrency=(1,), stream=False, max_tokens=3):
    return {
        "out": str(out),
        "bootstrap": 100,
        "slowest": 0,
        "tracing": tracing,
        "witness": "pcap",
        "server": {"engine": "synthetic", "prefill_ms_per_token": 0.0, "decode_ms_per_token": decode_ms},
        "load": {
            "duration_s": 2,
            "warmup_s": 0.3,
            "rounds": 1,
            "concurrency": list(concurrency),
            "stream": stream,
            "max_tokens": max_tokens,
            "prompt_tokens": 32,
        },
        "targets": targets,
    }


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("witness")
    targets = [
        {
            "name": f"pt-{hop}-{'d' if d else '0'}",
            "kind": "gateway",
            "mode": "passthrough",
            "network": {"hop": hop, "delay_ms": d},
        }
        for hop, delay in (("upstream", D_UP), ("client", D_CLIENT))
        for d in (0.0, delay)
    ]
    return run_compare(_config(tmp / "out", targets), tmp / "w.yaml", timeout=600)


def _w(report, name):
    w = report["targets"][name]["witness"]
    assert w["matched"] >= 0.95 * w["requests"] and w["requests"] >= 50, w
    assert w["negative_stacks"] <= 0.02 * w["matched"], w  # a hop never reports more than its packets allow
    return w


def test_witness_agrees_with_the_split_per_link(report):
    for name in report["targets"]:
        w = _w(report, name)
        for split, witness in zip(w["split_network"], w["witness_network"]):
            assert abs(witness - split) <= max(0.05 * split, 0.2), (name, w)


@pytest.mark.parametrize("hop,delay,link", [("upstream", D_UP, 1), ("client", D_CLIENT, 0)])
def test_a_known_delay_is_wire_time_on_its_link_only(report, hop, delay, link):
    base, wan = _w(report, f"pt-{hop}-0"), _w(report, f"pt-{hop}-d")
    shift = wan["links"][link]["wire"] - base["links"][link]["wire"]
    # the relay holds each chunk D plus what its thread's sleep overshoots (0.05-0.25 ms per direction
    # on a busy machine); its D = 0 twin does not sleep
    assert 2 * delay - 0.2 <= shift <= 2 * delay + 0.5, (shift, base["links"], wan["links"])
    other = 1 - link
    assert abs(wan["links"][other]["wire"] - base["links"][other]["wire"]) <= 0.2, (base["links"], wan["links"])


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """Tracing on, concurrency 1 and 4: HTTP/1.1 (direct, transcode's client link) and HTTP/2 (gRPC:
    direct, transcode's upstream, passthrough's two links) found by trace id."""
    tmp = tmp_path_factory.mktemp("witness-traced")
    targets = [
        {"name": "direct-http", "kind": "direct", "protocol": "http"},
        {"name": "direct-grpc", "kind": "direct", "protocol": "grpc"},
        {"name": "passthrough", "kind": "gateway", "mode": "passthrough"},
        {"name": "transcode", "kind": "gateway", "mode": "transcode"},
    ]
    cfg = _config(tmp / "out", targets, tracing=True, decode_ms=0.5, concurrency=(1, 4), stream=True, max_tokens=4)
    return run_compare(cfg, tmp / "t.yaml", timeout=600)


#: the share of requests at c=4 with a stack below zero that is known, not a mismatch (requests matched to
#: another's packets put about half below zero). Transcode's last chunk waits for the server's trailers,
#: which a loaded server (its loop busy with 3 others) sends late after its total; the gateway cannot
#: see them arrive (grpc.aio), so its work on the last chunks while they were on their way counts as
#: having held the stream back: 1.0-2.5 % of records, up to -1.7 ms on its upstream-side stack
#: (pathprobe.timing.finished_ms; 2.0-2.7 % before it)
NEGATIVE_SHARE = {"transcode": 0.05}


def test_requests_found_by_trace_id_are_the_ones_their_time_windows_hold_at_concurrency_1(traced):
    """At c=1 both ways of finding a request's packets apply: the trace id must find the same packets
    (each link's wire and stacks), and at c=4 no hop may report more time than its packets allow (a
    request matched to another's packets would, often)."""
    for name, t in traced["targets"].items():
        by_time, c1, c4 = t["witness"], t["witness"]["by_concurrency"]["1"], t["witness"]["by_concurrency"]["4"]
        assert by_time["matched"] >= 0.95 * by_time["requests"] >= 20, (name, by_time)
        # a packet tcpdump lost costs the requests next to it only (pathprobe.analysis.lab.wirestreams)
        assert c1["matched"] >= 0.95 * c1["requests"] >= 20, (name, c1, traced["witness"])
        for a, b in zip(by_time["links"], c1["links"], strict=True):
            for k in ("wire", "stack_outer", "stack_inner"):
                assert abs(a[k] - b[k]) <= 0.02, (name, k, by_time["links"], c1["links"])
        assert c4["matched"] >= 0.95 * c4["requests"] >= 40, (name, c4, traced["witness"])
        assert c4["negative_stacks"] <= NEGATIVE_SHARE.get(name, 0.02) * c4["matched"], (name, c4)
