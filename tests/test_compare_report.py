"""compare's report: figures, Markdown, report.json, and the HTML opened in headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from pathprobe.analysis.lab.compare import build_report, write_reports
from pathprobe.analysis.lab.config import parse_config
from pathprobe.analysis.lab.loadrun import RunResult
from pathprobe.analysis.lab.paths import Path_
from pathprobe.analysis.report.markdown import markdown

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _records(rng, n, base_ms, stream, rnd, conc, fail=0):
    out = []
    for i in range(n):
        net, ser, q, inf = (
            rng.gamma(4, base_ms / 8),
            rng.gamma(2, 0.02),
            rng.exponential(0.1 * conc),
            5 + rng.normal(0, 0.1),
        )
        other = rng.gamma(2, 0.05)
        e2e = net + ser + q + inf + other
        ok = i >= fail
        out.append(
            {
                "ts": 1000.0 + i * 0.01,
                "route": "grpc.Generate",
                "ok": ok,
                "status": "OK" if ok else "UNAVAILABLE",
                "error": None if ok else "upstream down",
                "e2e_ms": e2e,
                "latency_ms": e2e,
                "client_encode_ms": 0.01,
                "client_decode_ms": 0.01,
                "ttft_ms": inf / 3 + net if stream else None,
                "itl_ms": list(rng.gamma(4, 0.25, 15)) if stream else [],
                "tpot_ms": 0.3 if stream else None,
                "tokens_in": 64,
                "tokens_out": 16,
                "schedule_lag_ms": 0.0,
                "entries": {},
                "split": {
                    "e2e": e2e,
                    "network": net,
                    "serialization": ser,
                    "queueing": q,
                    "inference": inf,
                    "other": other,
                    "unsplit": 0.0,
                    "network_hop1": net,
                    "network_hop2": 0.0,
                }
                if ok
                else None,
                "trace_id": f"{rnd:04x}{conc:04x}{i:024x}",
                "_round": rnd,
                "_concurrency": conc,
            }
        )
    return out


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    cfg = parse_config(
        {
            "out": str(out),
            "bootstrap": 200,
            "load": {"rounds": 2, "concurrency": [1, 4], "stream": True, "duration_s": 2},
            "targets": [
                {"name": "direct-grpc", "kind": "direct"},
                {"name": "passthrough", "kind": "gateway", "mode": "passthrough"},
                {"name": "same", "kind": "direct"},
                {"name": "broken", "kind": "gateway", "mode": "reencode"},
                {"name": "nginx", "kind": "nginx"},
            ],
        }
    )
    rng = np.random.default_rng(0)
    base = {"direct-grpc": 1.0, "passthrough": 3.0, "same": 1.0, "broken": 1.0}
    paths = {t.name: Path_(t, url="grpc://x", status="ok") for t in cfg.targets}
    paths["nginx"].status, paths["nginx"].reason = "skipped", "nginx is not installed (not on PATH)"
    paths["broken"].status = "failed"
    paths["broken"].reason = "broken exited with code -9 during round 1, concurrency 4: killed"
    results = {}
    for name, b in base.items():
        runs = []
        for rnd in range(2):
            for conc in (1, 4):
                if name == "broken" and (rnd, conc) > (0, 1):
                    continue
                recs = _records(rng, 300, b, True, rnd, conc, fail=5 if name == "broken" else 0)
                runs.append(RunResult(name, conc, rnd, out, recs, 2.0))
        results[name] = runs
    warm = {"direct-grpc": RunResult("direct-grpc", 4, -1, out, _records(rng, 10, 30.0, True, 0, 4), 1.0)}
    report = build_report(cfg, paths, results, warm, "e2e", "2026-11-29T00:00:00Z", 0.0)
    write_reports(report, results, out, True, "e2e")
    return out, report


def test_report_json_has_every_figure(report_dir):
    out, _ = report_dir
    rep = json.loads((out / "report.json").read_text())
    t = rep["targets"]
    assert rep["baseline"] == "direct-grpc"
    g = t["passthrough"]["by_concurrency"]["4"]
    assert g["ok"] == 600 and g["errors"] == 0
    for q in ("p50", "p95", "p99"):
        assert g["e2e"][q]["lo"] <= g["e2e"][q]["value"] <= g["e2e"][q]["hi"]
    assert set(g["segments"]) >= {"network", "serialization", "queueing", "inference", "other"}
    assert g["ttft"]["n"] == 600 and g["itl"]["n"] == 600 * 15
    assert set(g["rounds"]) == {"0", "1"}
    cmp_ = g["comparison"]
    assert cmp_["significant"] and cmp_["p_value"] < 1e-6 and cmp_["cliffs_delta"] > 0.5
    assert not t["same"]["by_concurrency"]["1"]["comparison"]["significant"]
    assert t["broken"]["status"] == "failed" and "exited with code -9" in t["broken"]["reason"]
    assert t["broken"]["by_concurrency"]["1"]["errors"] == 5
    assert t["nginx"]["status"] == "skipped"
    assert t["direct-grpc"]["cold_start"]["first_ms"] > 0
    # a verdict only for the significant difference, at each concurrency
    assert {(v["target"], v["concurrency"]) for v in rep["verdicts"]} == {("passthrough", 1), ("passthrough", 4)}


def test_markdown_table(report_dir):
    _, report = report_dir
    md = markdown(report)
    assert "| direct-grpc (base) |" in md and "| passthrough |" in md
    assert "verdict**: c=4: passthrough is slower than direct-grpc" in md
    assert "nginx | skipped: nginx is not installed" in md
    assert "broken FAILED" in md


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_html_opens_in_headless_chromium(report_dir, tmp_path):
    out, _ = report_dir
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
    # the page's own script counted the plots the browser decoded (naturalWidth > 0)
    import re

    total = re.search(r'data-plots-total="(\d+)"', dom.stdout)
    loaded = re.search(r'data-plots-loaded="(\d+)"', dom.stdout)
    assert total and loaded, dom.stdout[:500]
    assert int(total.group(1)) == 5 and int(loaded.group(1)) == 5  # segments, CDF, waterfall, streaming, sweep
    shot = tmp_path / "shot.png"
    res = subprocess.run(
        [
            *flags,
            f"--user-data-dir={tmp_path / 'u2'}",
            "--window-size=1400,2400",
            f"--screenshot={shot}",
            html.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)
    assert img.shape[0] >= 2000 and img.shape[1] >= 1300
    # not a blank page: many distinct colours (plots), and the segment colours are present
    flat = (img[..., :3] * 255).astype(int).reshape(-1, 3)
    colours = {tuple(c) for c in flat[::37]}
    assert len(colours) > 50
    network_blue = np.array([0x4E, 0x79, 0xA7])
    assert (np.abs(flat - network_blue).sum(axis=1) < 12).sum() > 500  # the stacked bars' network colour


# --- the load generator's own saturation (summary.json "client" blocks) --------------------------
# recorded from real `pathprobe load` runs on the synthetic server (processes list trimmed):
# 4 users with --pathprobe-busy-ms 20 (saturated), 1 user (calm), 1 user on a busy box (contended)
CLIENT_SATURATED = json.loads(
    '{"loop_lag_ms": {"p50": 58.461, "p99": 113.711, "max": 113.711, "mean": 61.4289, "samples": 45}, '
    '"loop_busy_lag_ms": {"p50": 57.615, "p99": 102.155, "max": 102.155, "mean": 58.3945, "samples": 45}, '
    '"cpu_percent": {"mean": 89.7, "max": 92.7, "process_mean": 92.5, "process_max": 95.2}, "saturated": true, '
    '"reason": "event-loop lag p99 113.7 ms, 102.2 ms of it with the loop busy (>= 5 ms)", "contended": false, '
    '"contended_reason": null, "lag_threshold_ms": 5.0, "cpu_threshold_percent": 90.0, "process": "local"}'
)
CLIENT_CALM = json.loads(
    '{"loop_lag_ms": {"p50": 0.418, "p99": 3.934, "max": 29.142, "mean": 0.6808, "samples": 514}, '
    '"loop_busy_lag_ms": {"p50": 0.302, "p99": 1.408, "max": 29.142, "mean": 0.5202, "samples": 514}, '
    '"cpu_percent": {"mean": 14.2, "max": 16.1, "process_mean": 17.9, "process_max": 20.1}, "saturated": false, '
    '"reason": null, "contended": false, "contended_reason": null, "lag_threshold_ms": 5.0, '
    '"cpu_threshold_percent": 90.0, "process": "local"}'
)
CLIENT_CONTENDED = json.loads(
    '{"loop_lag_ms": {"p50": 0.43, "p99": 9.301, "max": 34.685, "mean": 0.7891, "samples": 505}, '
    '"loop_busy_lag_ms": {"p50": 0.264, "p99": 1.376, "max": 34.031, "mean": 0.5367, "samples": 505}, '
    '"cpu_percent": {"mean": 14.4, "max": 16.5, "process_mean": 18.5, "process_max": 20.6}, "saturated": false, '
    '"reason": null, "contended": true, "contended_reason": "event-loop lag p99 9.3 ms while the loop itself was '
    'mostly idle (busy lag p99 1.4 ms)", "lag_threshold_ms": 5.0, "cpu_threshold_percent": 90.0, "process": "local"}'
)


@pytest.fixture(scope="module")
def saturated_dir(tmp_path_factory):
    """Like the H200 run at c=32: the baseline's one load process saturated, its hop 1 inflated;
    the other paths' clients fine. c=1: everyone calm (transcode's runs predate the block)."""
    out = tmp_path_factory.mktemp("saturated")
    cfg = parse_config(
        {
            "out": str(out),
            "bootstrap": 200,
            "load": {"rounds": 2, "concurrency": [1, 32], "stream": False, "duration_s": 2},
            "targets": [
                {"name": "direct-grpc", "kind": "direct"},
                {"name": "direct-http", "kind": "direct", "protocol": "http"},
                {"name": "transcode", "kind": "gateway", "mode": "transcode"},
            ],
        }
    )
    rng = np.random.default_rng(1)
    paths = {t.name: Path_(t, url="grpc://x", status="ok") for t in cfg.targets}
    results = {}
    for name in ("direct-grpc", "direct-http", "transcode"):
        runs = []
        for rnd in range(2):
            for conc in (1, 32):
                hot = name == "direct-grpc" and conc == 32
                recs = _records(rng, 300, 40.0 if hot else 1.0, False, rnd, conc)
                if name == "transcode":
                    client = None
                elif hot:
                    client = CLIENT_SATURATED
                elif name == "direct-http" and conc == 32 and rnd == 1:
                    client = CLIENT_CONTENDED
                else:
                    client = CLIENT_CALM
                d = out / "runs" / name / f"c{conc}" / f"r{rnd}"
                d.mkdir(parents=True)
                (d / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
                (d / "summary.json").write_text(json.dumps({"meta": {"duration_s": 2.0}, "client": client}))
                runs.append(RunResult(name, conc, rnd, d, recs, 2.0, client=client))
        results[name] = runs
    report = build_report(cfg, paths, results, {}, "e2e", "2026-11-29T00:00:00Z", 0.0)
    write_reports(report, results, out, True, "e2e")
    return out, report


def test_report_json_carries_client_blocks_and_warns_where_saturated(saturated_dir):
    out, _ = saturated_dir
    rep = json.loads((out / "report.json").read_text())
    t = rep["targets"]
    hot = t["direct-grpc"]["by_concurrency"]["32"]["client"]
    assert hot["saturated"] is True and hot["saturated_rounds"] == [1, 2]
    assert hot["loop_lag_ms"]["p99"] == pytest.approx(113.711) and hot["cpu_percent"]["mean"] == pytest.approx(89.7)
    assert set(hot["rounds"]) == {"0", "1"} and "loop busy" in hot["reason"]
    assert t["direct-grpc"]["by_concurrency"]["1"]["client"]["saturated"] is False
    http32 = t["direct-http"]["by_concurrency"]["32"]["client"]
    assert http32["saturated"] is False and http32["contended"] is True and http32["contended_rounds"] == [2]
    assert "client" not in t["transcode"]["by_concurrency"]["32"]  # runs without the block: nothing invented
    warns = rep["client_warnings"]
    assert [(w["concurrency"], w["kind"], w["targets"]) for w in warns] == [
        (32, "saturated", ["direct-grpc"]),
        (32, "contended", ["direct-http"]),
    ]
    assert "client saturated at concurrency 32 in direct-grpc" in warns[0]["text"]
    assert "--processes" in warns[0]["text"]
    # every verdict at c=32 is against the saturated baseline; its difference is on hop 1 -> flagged
    v32 = [v for v in rep["verdicts"] if v["concurrency"] == 32]
    assert {v["target"] for v in v32} == {"direct-http", "transcode"}
    for v in v32:
        assert v["client_flag"] == "client saturated — not a path difference", v
        assert v["client_saturated"] == ["direct-grpc"] and "FLAGGED" in v["text"]
    assert all(not v["client_flag"] for v in rep["verdicts"] if v["concurrency"] == 1)


def test_markdown_warning_sits_under_its_concurrency(saturated_dir):
    _, report = saturated_dir
    md = markdown(report)
    head, rest = md.split("### concurrency 1", 1)
    c1, c32 = rest.split("### concurrency 32")
    assert "client saturated" not in c1 and "waited for a core" not in c1
    assert (
        "- **WARNING**: client saturated at concurrency 32 in direct-grpc (rounds 1, 2: event-loop lag p99 113.7 ms"
        in c32
    )
    # a client that waited for a core (other processes) is said once for the run, at the top
    assert md.count("waited for a core") == 1 and "waited for a core at concurrency 32 (" in head
    assert "- **verdict** (flagged: client saturated — not a path difference): c=32: direct-http" in c32
    assert "| direct-grpc (base) [client saturated] |" in c32 and "| direct-http |" in c32
    # the warning comes right after the table, before the verdicts
    assert c32.index("**WARNING**") < c32.index("**verdict**")


def test_html_shows_the_warning_and_flags_verdicts(saturated_dir):
    out, _ = saturated_dir
    page = (out / "report.html").read_text()
    i32 = page.index("<h2>concurrency 32</h2>")
    i1 = page.index("<h2>concurrency 1</h2>")
    warn = page.index("<div class='client-warning'><b>WARNING:</b> client saturated at concurrency 32 in direct-grpc")
    assert i1 < i32 < warn
    assert page.count("class='client-warning'") == 1 and page.count("class='client-note'") == 1
    assert page.count("<div class='verdict flagged'><b>flagged: client saturated — not a path difference</b>") == 2


def test_rerender_reads_the_client_blocks_back(saturated_dir, tmp_path):
    import shutil as sh

    from pathprobe.analysis.lab.rerender import rerender

    src, _ = saturated_dir
    out = tmp_path / "copy"
    sh.copytree(src, out)
    rep = rerender(out, log=lambda _m: None)
    assert rep.targets["direct-grpc"].by_concurrency["32"].client.saturated is True
    assert [w.kind for w in rep.client_warnings] == ["saturated", "contended"]
    assert "client saturated at concurrency 32" in (out / "report.md").read_text()
