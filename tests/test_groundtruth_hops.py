"""Ground truth that can fail: a known delay on one hop at a time, on every path, unary and streams.

One interleaved compare run per kind of call (unary, stream) with the synthetic engine. Every path
(direct gRPC, each gateway mode, nginx) appears twice per hop: once behind a delaying relay with
D = 0 (the baseline: the relay's own cost is on both sides of the difference) and once with a one-way
delay D on that hop (client <-> first hop, or first hop <-> server). Calls are interleaved one by one
and each delayed call is paired with its D = 0 twin's call of the same cycle, so the medians of the
paired differences carry no drift of the shared machine.

What must hold (issue 9):
- per pair, d(network) = d(e2e) within max(10% of 2 x D, 0.3 ms), and it lands on the delayed hop's
  link; the other link's network and every other segment (serialization, queueing, inference, and
  "other" less the time the components spent behind) move < 0.3 ms (medians over the pairs);
- the time behind (each hop's ``<kind>.backlog``, the client's wait) is reported with each pair, not
  bounded (see below);
- d(e2e) is about what the relay injected: 2 x D (one traversal each way);
- streams: TTFT moves by about 2 x D too, and the gaps between tokens do not (< 0.3 ms).

On streams a delay also changes what runs at the same time: with D = 0 the receiving side works on
chunk k while the sender hands over chunk k+1, with D > 0 it works later. grpc.aio's per-chunk send
completes 0.1-0.5 ms faster in total when the other core is idle; those waits are the link's stack
time (``srv.send`` / ``gw.send``, booked as the network of the link towards the client), so they
land on the link they belong to and never in a hop's "other" (docs/design.md).

Why the time behind is apart: an engine that never sleeps hands the server all of a stream's tokens
at once, so the server (and a gateway after it) is behind by construction, and its hand-offs after
its producer was done are its backlog (docs/design.md, "One rule for a stream's per-chunk costs").
On 2 cores those hand-offs compete for a CPU with the next hop reading the same chunks; a delayed
link keeps that hop idle meanwhile, and the sender's backlog shrinks (measured on the 2-core machine,
transcode: gw.backlog -0.16 ms and the client's wait -0.10 with the client link delayed, srv.backlog
-0.29 with the server link delayed; "other" -0.26 to -0.36, which failed one CI run at 0.3). That is
the machine's contention taken away by the delay, booked to the component that was behind, as the
rule says; it is not the delay landing on the wrong segment, so it is kept apart. It can grow too: a
delaying relay that hands a hop its chunks in a burst puts it behind where it kept up (reencode's
server link delayed: +0.30 and +0.49 ms in two runs of 2026-12-03), so it is reported, not bounded.

nginx runs pathprobe's reporting config (``nginx.upstream`` / ``nginx.total`` in the gRPC trailers,
to its clock's 1 ms), so its two links are apart like a gateway's; that is asserted too. CI time:
about 5-7 minutes for the two runs on a 2-core machine.

The synthetic engine does not sleep here (0 ms per token): its timer wake-ups on a busy machine are
1-20 ms late, noise in e2e that is not in network. What is left is the paths' own stack jitter
(gRPC and HTTP stacks waiting for a CPU), which is network by the split's definition; 4 s per
configuration (250-470 pairs on the 2-core machine, twice what 2 s gave) keeps the standard error of
each paired median near 0.1 ms on a loaded box for all but the noisiest link (transcode's gRPC
upstream).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.support.compare import run_compare

pytestmark = pytest.mark.slow

D_CLIENT, D_UPSTREAM = 2.5, 4.0  # one-way ms on each hop in turn
PATHS = {  # name -> target config without name/network
    "direct": {"kind": "direct", "protocol": "grpc"},
    "passthrough": {"kind": "gateway", "mode": "passthrough"},
    "transcode": {"kind": "gateway", "mode": "transcode"},
    "reencode": {"kind": "gateway", "mode": "reencode"},
    "http-proxy": {"kind": "gateway", "mode": "http-proxy"},
    "nginx": {"kind": "nginx"},
}
HOPS = {"client": D_CLIENT, "upstream": D_UPSTREAM}
STILL = ("serialization", "queueing", "inference", "own")
TOL = 0.3  # ms


def _hops(path: str) -> list[str]:
    return ["client"] if path == "direct" else ["client", "upstream"]


def _targets(paths: dict[str, dict] | None = None) -> list[dict]:
    out = []
    for path, spec in (paths or PATHS).items():
        for hop in _hops(path):
            for d in (0.0, HOPS[hop]):
                out.append(
                    {"name": f"{path}-{hop}-{'d' if d else '0'}", **spec, "network": {"hop": hop, "delay_ms": d}}
                )
    return out


def _run(
    tmp: Path,
    stream: bool,
    load: dict | None = None,
    paths: dict[str, dict] | None = None,
    args: list | None = None,
    timeout: float = 900,
) -> Path:
    """One interleaved compare run; ``load`` overrides the load settings, ``paths`` the paths, ``args``
    adds server flags; ``timeout`` (s) bounds compare's run."""
    out = tmp / ("stream" if stream else "unary")
    cfg = {
        "out": str(out),
        "bootstrap": 100,
        "slowest": 0,
        "tracing": False,
        # an engine that never sleeps: its timer wake-ups on a busy 2-core machine are 1-20 ms late, engine
        # noise that would sit in e2e (not in network) and blur the comparison of the two; tokens still go
        # out as separate messages / SSE events
        # The engine stays in the server's process (compare's default puts it in one of its own): this test
        # is about the links, and on 2 cores a further busy process adds CPU contention that differs with
        # the delay (a delayed client link leaves the client idle while hop 2 streams): transcode's stream
        # hop 2, not delayed, moved -0.32 ms in one fresh-clone run with it (bound 0.3)
        "server": {
            "engine": "synthetic",
            "prefill_ms_per_token": 0.0,
            "decode_ms_per_token": 0.0,
            "max_batch_size": 8,
            "engine_process": False,
            "extra_args": list(args or []),
        },
        "load": {
            # 4 s per configuration (was 2 s): on the 2-core CI machine the paired medians of the links
            # not delayed moved 0.33-0.45 ms in 2 of 7 runs at 2-3 s (transcode, nginx, reencode; bound
            # 0.3 ms); twice the pairs cut the standard error by ~1.4x. The bounds are unchanged
            "duration_s": 4.0,
            "warmup_s": 0.3,
            "rounds": 1,
            "concurrency": [1],
            "stream": stream,
            "prompt_tokens": 32,
            "max_tokens": 6 if stream else 3,
            "interleave": "call",
            **(load or {}),
        },
        "targets": _targets(paths),
    }
    report = run_compare(cfg, tmp / f"{out.name}.yaml", timeout=timeout)
    # a network condition with delay 0 is "inactive" for the config: make sure the relay is there anyway
    assert all(t["status"] == "ok" for t in report["targets"].values()), report["targets"]
    return out


def _records(out: Path, name: str) -> dict[tuple, dict]:
    recs = []
    for f in sorted((out / "runs" / name).glob("c*/r*/records.jsonl")):
        recs += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    ok = [r for r in recs if r["ok"]]
    assert len(ok) >= 30 and len(ok) >= len(recs) - 1, (name, len(ok), len(recs))
    return {(r["worker"], r["user"], r["cycle"]): r for r in ok}


def _behind(r: dict) -> float:
    """Of a record's "other", the time its components spent behind: each hop's ``<kind>.backlog``
    (hand-offs after its producer was done, reads of chunks already waiting) and the client's wait
    (its own event loop, its reads of its backlog)."""
    hops = sum(v for k, v in r["entries"].items() if k.endswith(".backlog"))
    return hops + r["split"].get("client_wait", 0.0)


def _value(r: dict, metric: str) -> float:
    if metric == "e2e":
        return r["e2e_ms"]
    if metric == "behind":
        return _behind(r)
    if metric == "own":  # "other" less the time behind: the hops' and the client's own work
        return r["split"]["other"] - _behind(r)
    if metric == "ttft":
        return r["ttft_ms"]
    if metric == "itl":
        return statistics.median(r["itl_ms"])
    return r["split"][metric]


def _paired(out: Path, path: str, hop: str) -> dict[str, float]:
    """Per pair (delayed call, its D=0 twin's call of the same cycle): the differences, and their medians.

    ``X-e2e`` is the median over pairs of (dX - de2e): per request, not a difference of two medians
    (medians do not add up, and the engine's and stacks' per-call noise sits in e2e)."""
    base, wan = _records(out, f"{path}-{hop}-0"), _records(out, f"{path}-{hop}-d")
    keys = sorted(set(base) & set(wan))
    assert len(keys) >= 30, (path, hop, len(keys))
    stream = wan[keys[0]].get("ttft_ms") is not None
    metrics = ["e2e", "network", "network_hop1", "network_hop2", *STILL, "behind"] + (["ttft", "itl"] if stream else [])
    d = {m: [_value(wan[k], m) - _value(base[k], m) for k in keys] for m in metrics}
    out_ = {m: statistics.median(v) for m, v in d.items()}
    for m in ("network", "network_hop1", "network_hop2", *(("ttft",) if stream else ())):
        out_[f"{m}-e2e"] = statistics.median(a - b for a, b in zip(d[m], d["e2e"]))
    return out_


def _check(d: dict[str, float], path: str, hop: str) -> None:
    delay = 2 * HOPS[hop]
    where = (path, hop, {k: round(v, 3) for k, v in d.items()})
    # what the relay injected: about 2 x D. Its D=0 twin's own per-chunk cost (a thread wake-up per
    # forwarded chunk, slower on a busy machine) is not exactly the delayed relay's, so this is a sanity
    # bound on the relay, not the check of the split (that is below, against the measured e2e)
    assert 0.7 * delay <= d["e2e"] <= delay + 2.0, where
    bound = max(0.1 * delay, TOL)
    assert abs(d["network-e2e"]) <= bound, where
    # the link it lands on (nginx reports its own time, so its upstream link is apart from the client's)
    moved, still = ("network_hop1", "network_hop2") if hop == "client" else ("network_hop2", "network_hop1")
    assert abs(d[f"{moved}-e2e"]) <= bound, where
    assert abs(d[still]) <= TOL, where
    for seg in STILL:
        assert abs(d[seg]) <= TOL, (seg, where)
    if "ttft" in d:
        # the first token crosses the delayed hop once each way, like the whole unary call
        assert 0.7 * delay <= d["ttft"] <= delay + 2.0, where
        assert abs(d["itl"]) <= TOL, where


@pytest.fixture(scope="module")
def unary(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("gt-hops"), stream=False)


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("gt-hops-stream"), stream=True)


@pytest.mark.parametrize("path", list(PATHS))
def test_unary_delay_on_each_hop_moves_only_that_hops_network(unary, path):
    for hop in _hops(path):
        _check(_paired(unary, path, hop), path, hop)


@pytest.mark.parametrize("path", list(PATHS))
def test_stream_delay_moves_ttft_and_network_not_gaps(stream, path):
    for hop in _hops(path):
        _check(_paired(stream, path, hop), path, hop)
