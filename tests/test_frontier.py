"""The throughput frontier finds a known knee, run as compare's frontier block: nginx with
``limit_req`` (a leaky bucket that DELAYS requests beyond its rate, so the path's capacity is that
rate exactly) in front of a fast server; the frontier of every generous bound lands within 10 % of
the configured capacity. The search itself (step up, bisect, refuse a saturated client) is checked
on a made-up path too."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pathprobe import proxies
from pathprobe.analysis.lab import frontier as fr
from pathprobe.analysis.report.model import Report

from tests.support.procs import Server, free_port
from tests.test_proxies import Running

#: requests/s nginx lets through (limit_req rate). Below it nginx still spaces requests that come
#: closer than 1/rate (50 ms: a late client or a late nginx timer costs little against that), so
#: the bounds checked are well above that shaping; above it the wait grows with the run (5 % over
#: it for 6 s: about 6 requests x 50 ms behind)
CAPACITY = 20.0


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Running]]:
    if proxies.executable("nginx") is None:
        pytest.skip(proxies.missing_reason("nginx"))
    tmp = tmp_path_factory.mktemp("frontier")
    srv = Server(tmp, "--engine", "synthetic", "--max-batch-size", "64", "--max-wait-ms", "0")
    port = free_port()
    launch = proxies.launch("nginx", tmp / "nginx", f"127.0.0.1:{port}", [f"127.0.0.1:{srv.http_port}"], "http")
    text = launch.config.read_text()
    zone = f"limit_req_zone $binary_remote_addr zone=cap:1m rate={CAPACITY:.0f}r/s;"
    text = text.replace("http {", f"http {{\n    {zone}", 1)
    cap = "limit_req zone=cap burst=100000;"  # no nodelay: beyond the rate, requests wait their turn
    text = text.replace("proxy_pass http://llm;", f"proxy_pass http://llm;\n            {cap}")
    launch.config.write_text(text)
    ngx = Running(launch, port, tmp / "nginx.log")
    yield srv, ngx
    ngx.stop()
    srv.stop()


@pytest.mark.slow
def test_compare_frontier_finds_a_known_capacity(capped, tmp_path: Path) -> None:
    """compare's frontier block (remote mode: the capped nginx and the server's own HTTP port, the
    direct path of the same protocol), read back from report.json: the knee of every generous bound
    within 10 % of the cap, each step with its load generators' health, CPU/RSS absent (nothing of
    the path's own is local) and the scorecard carrying the same knees."""
    srv, ngx = capped
    out = tmp_path / "out"
    cfg = {
        "mode": "remote",
        "tracing": False,
        "load": {"rounds": 1, "duration_s": 1, "warmup_s": 0, "concurrency": [1], "stream": False, "max_tokens": 1},
        "targets": [
            {"name": "direct-http", "kind": "direct", "protocol": "http", "address": srv.http_url},
            {"name": "capped", "kind": "nginx", "protocol": "http", "address": f"http://127.0.0.1:{ngx.port}"},
        ],
        "frontier": {
            **{"bounds_ms": [100, 200], "start_rps": 10, "max_rps": 160, "tolerance": 0.1},
            **{"duration_s": 4, "warmup_s": 0.5, "users": 64},
        },
    }
    (tmp_path / "cfg.yaml").write_text(json.dumps(cfg))
    args = [sys.executable, "-m", "pathprobe", "compare", str(tmp_path / "cfg.yaml"), "--out", str(out), "--no-html"]
    res = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = Report.read((out / "report.json").read_text())
    assert report.schema_version >= 2 and report.frontier is not None
    found = report.frontier.targets["capped"]
    assert found.against == "direct-http" and found.unary is not None and "direct-http" not in report.frontier.targets
    search = found.unary
    assert not search.refused, search.note
    points = [(p.load, p.added_p99_ms) for p in search.points]
    for bound in (100.0, 200.0):
        knee = search.knee(bound)
        assert knee is not None and knee.load is not None and knee.next_load is not None, (knee, points)
        assert abs(knee.load - CAPACITY) <= 0.1 * CAPACITY, (knee, points)
    for p in search.points:  # every step: both load processes' own health, judged
        assert set(p.clients) == {"path", "direct"} and not p.client_saturated
        assert all(c["loop_lag_p99_ms"] is not None for c in p.clients.values()), p.clients
        assert p.cpu_ms_per_request is None and p.rss_mb is None  # remote: no process of the path's own
    low, high = search.points[0], search.points[-1]
    assert low.added_p99_ms is not None and low.added_p99_ms < 100.0 and low.achieved is not None
    assert abs(low.achieved - low.load) <= 0.15 * low.load, (low.achieved, low.load)  # the rate was offered
    assert high.added_p99_ms is not None and high.added_p99_ms > 200.0
    assert report.scorecard is not None
    row = next(r for r in report.scorecard.rows if r.target == "capped")
    assert row.frontier_rps is not None and row.frontier_rps["100"].load == search.knee(100.0).load  # type: ignore[union-attr]


def _made_up(capacity: float, saturate_at: float | None = None) -> fr.Measure:
    """A path that adds 1 ms below ``capacity`` and 1 ms per 1 % above it."""

    def measure(load: float) -> fr.Point:
        if saturate_at is not None and load >= saturate_at:
            return fr.Point(load, None, None, 100, 0, client_saturated=True, reason="loop busy")
        added = 1.0 if load <= capacity else 1.0 + 100 * (load / capacity - 1)
        return fr.Point(load, added, added, 100, 0)

    return measure


def test_search_bisects_each_bound_and_refuses_a_saturated_client() -> None:
    result = fr.search(_made_up(300.0), (5.0, 50.0), start=10.0, limit=10_000.0, tolerance=0.01)
    five, fifty = result.knee(5.0), result.knee(50.0)
    assert five.load is not None and 300.0 <= five.load <= 312.0 and five.next_load <= five.load * 1.01 + 1e-9
    assert fifty.load is not None and 440.0 <= fifty.load <= 450.0
    assert len(result.points) < 25, "bisection, not a grid"
    refused = fr.search(_made_up(300.0, saturate_at=200.0), (5.0,), start=50.0, limit=10_000.0)
    assert [p.load for p in refused.refused] == [200.0] and "saturated" in refused.note
    knee = refused.knee(5.0)
    assert knee.load == 100.0 and knee.next_load is None, "no figure beyond what was measured"


def test_frontier_config_checks_and_litellm_interleaves_with_openai_paths_only() -> None:
    """The frontier block's checks name the field; LiteLLM (its own key and chat route) interleaves call
    by call with OpenAI-speaking paths (so the scorecard pairs it), never with a gRPC or plain HTTP one."""
    from pathprobe.analysis.lab.config import TargetConfig, parse_config
    from pathprobe.analysis.lab.loadrun import interleavable
    from pathprobe.analysis.lab.paths import Path_
    from pathprobe.errors import ConfigError

    base = {"server": {"engine": "synthetic", "decode_ms_per_token": 20}}
    cfg = parse_config({**base, "frontier": {"stream": {"gap_ms": 20}, "targets": ["nginx"]}})
    assert cfg.frontier is not None and cfg.frontier.bounds_ms == [1.0, 5.0, 10.0, 50.0]
    with pytest.raises(ConfigError, match="frontier.stream.gap_ms"):
        parse_config({**base, "frontier": {"stream": {"gap_ms": 10}}})
    with pytest.raises(ConfigError, match="frontier.targets"):
        parse_config({"frontier": {"targets": ["nope"]}})
    with pytest.raises(ConfigError, match="start_rps"):
        parse_config({"frontier": {"start_rps": 500, "max_rps": 100}})

    def path(name: str, kind: str, protocol: str, litellm: bool = False) -> Path_:
        p = Path_(TargetConfig(name=name, kind=kind, protocol=protocol))  # type: ignore[arg-type]
        if litellm:
            p.headers, p.load_args = {"Authorization": "Bearer k"}, ["--openai-api", "chat", "--model", "m"]
        return p

    lite = path("litellm", "litellm", "openai", litellm=True)
    assert interleavable(cfg, [path("direct-openai", "direct", "openai"), lite])
    assert not interleavable(cfg, [path("direct-http", "direct", "http"), lite])
    assert interleavable(cfg, [path("direct-http", "direct", "http"), path("nginx", "nginx", "http")])
