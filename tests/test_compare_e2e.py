"""`pathprobe compare` end to end: the default matrix (every path, nginx when installed) on the
synthetic engine, its HTML report opened in headless Chromium; remote mode with open-loop arrival."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support.procs import Server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
ALL = (
    "direct-grpc",
    "direct-http",
    "direct-http-fastapi",
    "passthrough",
    "transcode",
    "reencode",
    "http-proxy",
    "nginx",
)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e") / "out"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "compare",
            str(ROOT / "configs" / "default.yaml"),
            "--engine",
            "synthetic",
            "--decode-ms-per-token",
            "0.5",
            "--duration",
            "1",
            "--warmup",
            "1",
            "--rounds",
            "2",
            "--concurrency",
            "1,2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    return out, res


def test_default_matrix_prints_side_by_side_table(default_run):
    out, res = default_run
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for c in (1, 2):
        assert f"### concurrency {c}" in res.stdout
    report = json.loads((out / "report.json").read_text())
    # the local server's startup phases, first request included (read from its /metrics)
    assert report["server_startup_ms"]["total"] > 0 and "first_request" in report["server_startup_ms"]
    nginx_ok = shutil.which("nginx") is not None
    for name in ALL:
        t = report["targets"][name]
        if name == "nginx" and not nginx_ok:
            assert t["status"] == "skipped" and "not installed" in t["reason"]
            assert "nginx | skipped" in res.stdout
            continue
        assert t["status"] == "ok", (name, t["reason"])
        # its row is in the printed table (the figures are checked on report.json below)
        assert any(line.startswith(f"| {name}") for line in res.stdout.splitlines()), name
        for c in ("1", "2"):
            g = t["by_concurrency"][c]
            assert g["ok"] > 0 and g["errors"] == 0
            assert g["ttft"]["n"] > 0 and g["itl"]["n"] > 0  # the default streams
        assert t["cold_start"]["first_ms"] > 0
        # the slowest requests' traces are written as Jaeger files and listed
        slow = t["slowest"]
        assert len(slow) == 5 and all((out / s["file"]).exists() for s in slow)
        doc = json.loads((out / slow[0]["file"]).read_text())
        services = {p["serviceName"] for p in doc["data"][0]["processes"].values()}
        assert {"pathprobe-loadgen", "pathprobe-server"} <= services
        if t["kind"] == "gateway":
            assert "pathprobe-gateway" in services
        # analyze's split from this run's traces agrees with in-band on e2e and the server's segments
        agr = t["trace_agreement"]["attributes"]
        assert agr["matched"] > 0
        for seg in ("e2e", "inference"):
            assert agr["outside"][seg] == 0, (name, seg, agr)
        # queueing holds a hop's wait before its first timestamp, capped at its link: where the cap binds
        # it is the link's time, so it can disagree only where the link does (behind nginx, whose time the
        # trace cannot see, network+other is compared together and may)
        link = agr["outside"].get("network", agr["outside"].get("network+other", 0))
        assert agr["outside"]["queueing"] <= link, (name, agr)
    # analyze reads the whole run's trace folder
    res2 = subprocess.run(
        [sys.executable, "-m", "pathprobe", "analyze", str(out / "traces")], capture_output=True, text=True, timeout=300
    )
    assert res2.returncode == 0 and "grpc.GenerateStream" in res2.stdout, res2.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_real_report_opens_in_headless_chromium(default_run, tmp_path):
    out, res = default_run
    assert res.returncode == 0
    html = out / "report.html"
    flags = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ]
    dom = subprocess.run(
        [*flags, f"--user-data-dir={tmp_path / 'u1'}", "--virtual-time-budget=20000", "--dump-dom", html.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    # stacked segments, CDFs, TTFT/ITL, sweep: all four decoded by the browser
    # the page's own script counted the plots the browser decoded (naturalWidth > 0): every one of them
    total = re.search(r'data-plots-total="(\d+)"', dom.stdout)
    loaded = re.search(r'data-plots-loaded="(\d+)"', dom.stdout)
    assert total and loaded and int(total.group(1)) >= 5, dom.stdout[:500]
    assert loaded.group(1) == total.group(1)
    assert "traces/slowest/passthrough/01-" in dom.stdout
    shot = tmp_path / "shot.png"
    res = subprocess.run(
        [
            *flags,
            f"--user-data-dir={tmp_path / 'u2'}",
            # the path-tax tables and verdicts lead the page: the plots start ~3700 px down
            "--window-size=1400,12000",
            "--virtual-time-budget=20000",
            f"--screenshot={shot}",
            html.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and shot.exists()
    import matplotlib.image as mpimg
    import numpy as np

    flat = (mpimg.imread(shot)[..., :3] * 255).astype(int).reshape(-1, 3)
    assert (np.abs(flat - np.array([0x59, 0xA1, 0x4F])).sum(axis=1) < 12).sum() > 500  # inference bars


class _Anchored(HTMLParser):
    """The laid-out box (``data-box``: left, top, right, bottom in CSS px, set by the page's own script)
    of every element with an id, and the order of the page's plots and tables."""

    def __init__(self) -> None:
        super().__init__()
        self.boxes: dict[str, tuple[int, ...]] = {}
        self.order: list[tuple[str, str]] = []  # (tag, id or class) of each img.plot and table

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id") and a.get("data-box"):
            self.boxes[a["id"]] = tuple(int(v) for v in a["data-box"].split(","))
        if tag == "table" or (tag == "img" and a.get("class") == "plot"):
            self.order.append((tag, a.get("id") or a.get("class") or ""))


FIRST_SCREEN = (1280, 900)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_first_screen_is_the_figure_then_the_scorecard(default_run, tmp_path):
    """What a newcomer sees first: the page opens with the added-cost figure, then the scorecard, both on
    a 1280x900 screen; every path is paired with the direct path of its own client protocol."""
    out, res = default_run
    assert res.returncode == 0
    report = json.loads((out / "report.json").read_text())
    direct = {"grpc": "direct-grpc", "http": "direct-http"}
    card = {r["target"]: r["against"] for r in report["scorecard"]["rows"]}
    for name, t in report["targets"].items():
        if t["status"] != "ok" or t["kind"] == "direct":
            continue
        assert card[name] == direct[t["protocol"]], (name, card)
        for g in t["by_concurrency"].values():
            assert g["paired"]["against"] == direct[t["protocol"]], name
    width, height = FIRST_SCREEN
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-dev-shm-usage"]
    flags += [f"--window-size={width},{height}", "--virtual-time-budget=20000"]
    dom = subprocess.run(
        [*flags, f"--user-data-dir={tmp_path / 'u1'}", "--dump-dom", (out / "report.html").as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = _Anchored()
    page.feed(dom.stdout)
    # the figure is the page's first plot and the scorecard its first table
    assert page.order[0] == ("img", "lead-figure") and page.order[1] == ("table", "scorecard"), page.order[:3]
    fig, sc = page.boxes["lead-figure"], page.boxes["scorecard"]
    assert 0 <= fig[1] < fig[3] <= height, fig  # the whole figure on the first screen
    assert fig[3] <= sc[1] < height - 40, sc  # then the scorecard starts on it (its header row at least)
    shot = tmp_path / "first.png"
    got = subprocess.run(
        [*flags, f"--user-data-dir={tmp_path / 'u2'}", f"--screenshot={shot}", (out / "report.html").as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0 and shot.exists(), got.stderr[-2000:]
    import matplotlib.image as mpimg

    img = (mpimg.imread(shot)[..., :3] * 255).astype(int)
    assert img.shape[:2] == (height, width)
    region = img[fig[1] : fig[3], fig[0] : fig[2]].reshape(-1, 3)
    # the figure was drawn there: many colours (bars, text, not a blank or a broken image's icon), ink on it
    assert len({tuple(c) for c in region[::7]}) > 30
    assert (region.sum(axis=1) < 600).mean() > 0.02
    table = img[sc[1] : height, sc[0] : sc[2]].reshape(-1, 3)
    assert (table.sum(axis=1) < 200).sum() > 200  # the scorecard's text, dark on light


def test_remote_mode_open_loop(tmp_path):
    srv = Server(tmp_path, "--engine", "synthetic", "--decode-ms-per-token", "0.5")
    try:
        out = tmp_path / "out"
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "pathprobe",
                "compare",
                "--remote",
                "--out",
                str(out),
                "--targets",
                "grpc,http",
                "--target",
                f"grpc=grpc://{srv.grpc_target}",
                "--target",
                f"http={srv.http_url}",
                "--arrival",
                "constant",
                "--rate",
                "20",
                "--duration",
                "2",
                "--warmup",
                "1",
                "--rounds",
                "2",
                "--concurrency",
                "2",
                "--no-stream",
                "--no-tracing",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        srv.stop()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["method"]["primary_metric"] == "latency"  # open loop: measured from the intended send time
    assert "latency p50" in res.stdout
    for name in ("grpc", "http"):
        g = report["targets"][name]["by_concurrency"]["2"]
        # 20 req/s for 2 s, twice (Locust may cut the last one): about 80 requests
        assert 60 <= g["requests"] <= 84 and g["errors"] == 0, g["requests"]
        assert "schedule_lag" in g or g["latency"]["n"] == g["ok"]
    assert not (out / "logs" / "server.log").exists()  # remote mode starts nothing


def test_rerender_with_another_baseline_keeps_every_figure(default_run):
    out, res = default_run
    assert res.returncode == 0
    before = json.loads((out / "report.json").read_text())
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "compare",
            "--rerender",
            str(out),
            "--baseline",
            "passthrough",
            "--no-html",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    assert "| passthrough (base) |" in again.stdout
    after = json.loads((out / "report.json").read_text())
    assert after["baseline"] == "passthrough"
    for name, t in before["targets"].items():
        if t["status"] != "ok":
            continue
        for c, g in t["by_concurrency"].items():
            g2 = after["targets"][name]["by_concurrency"][c]
            assert g2["ok"] == g["ok"] and g2["e2e"]["p50"]["value"] == g["e2e"]["p50"]["value"]
        assert after["targets"][name].get("slowest") == t.get("slowest")
    assert "comparison" in after["targets"]["direct-grpc"]["by_concurrency"]["1"]
