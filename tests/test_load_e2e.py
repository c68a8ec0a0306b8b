"""`pathprobe load` end to end: real servers, real Locust, on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.procs import Proc, Server, free_port

pytestmark = pytest.mark.slow

SEGMENTS = ("network", "serialization", "queueing", "inference", "other")


def run_load(
    out: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "pathprobe",
        "load",
        "--headless",
        "--only-summary",
        "-L",
        "WARNING",
        "--out",
        str(out),
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc


def load_records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line]


def check_run(out: Path, route: str, stream: bool) -> tuple[dict, list[dict]]:
    summary = json.loads((out / "summary.json").read_text())
    recs = load_records(out)
    assert summary["totals"]["requests"] == len(recs) > 0
    assert summary["totals"]["errors"] == 0, summary["totals"]
    assert {r["route"] for r in recs} == {route}
    ok = [r for r in recs if r["ok"]]
    assert len(ok) == summary["totals"]["ok"] > 0
    for r in ok:
        sp = r["split"]
        assert sum(sp[s] for s in SEGMENTS) == pytest.approx(r["e2e_ms"], abs=1e-6)
        assert sp["e2e"] == r["e2e_ms"]
        assert sp["inference"] > 0 and r["entries"].get("srv.total", 0) > 0
        # a stream's split counts only the decode that held its end back (can be 0); the rest overlapped
        assert r["client_encode_ms"] > 0 and r["client_decode_ms"] >= 0
        assert r["client_decode_ms"] + r["client_decode_overlap_ms"] > 0
        assert r["tokens_out"] == 4
        if stream:
            assert r["ttft_ms"] is not None and 0 < r["ttft_ms"] < r["e2e_ms"]
            assert len(r["itl_ms"]) == 3
        else:
            assert r["ttft_ms"] is None
    rs = summary["routes"][route]
    for m in ("e2e", *SEGMENTS):
        st = rs["metrics"][m]
        assert st["count"] == len(ok) and st["p50"] <= st["p95"] <= st["p99"] <= st["max"]
    if stream:
        assert rs["metrics"]["ttft"]["count"] == len(ok)
        assert rs["metrics"]["itl"]["count"] == 3 * len(ok)
    csv = (out / "summary.csv").read_text().splitlines()
    assert csv[0].startswith("route,metric,count") and any(line.startswith(f"{route},e2e,") for line in csv)
    return summary, recs


ROUTES = [
    ("grpc", False, [], "grpc.Generate"),
    ("grpc", True, [], "grpc.GenerateStream"),
    ("http", False, [], "http.generate"),
    ("http", True, [], "http.generate.stream"),
    ("openai", False, [], "openai.completions"),
    ("openai", True, [], "openai.completions.stream"),
    ("openai", False, ["--openai-api", "chat"], "openai.chat"),
    ("openai", True, ["--openai-api", "chat"], "openai.chat.stream"),
]


@pytest.mark.parametrize(("kind", "stream", "extra", "route"), ROUTES, ids=[r[3] for r in ROUTES])
def test_load_each_route_prints_table_and_writes_files(synthetic_server, tmp_path, kind, stream, extra, route):
    host = {
        "grpc": f"grpc://{synthetic_server.grpc_target}",
        "http": synthetic_server.http_url,
        "openai": "openai+" + synthetic_server.http_url,
    }[kind]
    args = ["-H", host, "-u", "2", "-r", "2", "-t", "2s", "--max-tokens", "4", "--tokenizer", "none", *extra]
    if stream:
        args.append("--stream")
    proc = run_load(tmp_path, *args)
    summary, recs = check_run(tmp_path, route, stream)
    out = proc.stdout
    assert f"{route}:" in out and "p50" in out and "p95" in out and "p99" in out
    for m in ("e2e", *SEGMENTS):
        assert f"\n  {m} " in out
    if stream:
        assert "\n  ttft " in out and "\n  itl " in out
    # Locust's own stats saw the same requests (stopped-in-flight ones are not Locust failures)
    assert route in out and summary["meta"]["host"] == host


def test_every_request_is_accounted_for_including_errors(tmp_path):
    port = free_port()  # nothing listens: every request fails, none is dropped
    run_load(
        tmp_path,
        "-H",
        f"grpc://127.0.0.1:{port}",
        "-u",
        "2",
        "-r",
        "2",
        "-t",
        "2s",
        "--tokenizer",
        "none",
        "--timeout-s",
        "1",
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    recs = load_records(tmp_path)
    t = summary["totals"]
    assert t["requests"] == len(recs) > 0 and t["ok"] == 0
    assert t["errors"] + t["stopped"] == t["requests"]
    assert set(t["errors_by_status"]) <= {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
    assert all(r["split"] is None and r["error"] for r in recs)


def test_inference_segment_matches_synthetic_engine_time(tmp_path_factory, tmp_path):
    srv = Server(
        tmp_path_factory.mktemp("syn5"),
        "--engine",
        "synthetic",
        "--prefill-ms-per-token",
        "0.1",
        "--decode-ms-per-token",
        "5",
        "--max-batch-size",
        "4",
    )
    try:
        run_load(
            tmp_path,
            "-H",
            f"grpc://{srv.grpc_target}",
            "-u",
            "1",
            "-r",
            "1",
            "-t",
            "3s",
            "--max-tokens",
            "9",
            "--tokenizer",
            "none",
        )
    finally:
        srv.stop()
    recs = [r for r in load_records(tmp_path) if r["ok"]]
    assert len(recs) >= 10
    ratios = []
    for r in recs:
        expected = 0.1 * r["tokens_in"] + 5 * (9 - 1)  # first token comes out of prefill
        ratios.append(r["split"]["inference"] / expected)
        # the segment is exactly the engine's own entries, nothing of the path leaks in
        e = r["entries"]
        assert r["split"]["inference"] == pytest.approx(
            e["srv.tokenize"] + e["srv.prefill"] + e["srv.decode_steps"] + e["srv.detokenize"]
        )
        # the engine's queue; the front end's wait before the handler (srv.wait: how long gRPC's core held
        # the call, booked as queueing too) is the server's, 0-0.4 ms here, ~4 ms on a connection's first call
        assert r["split"]["queueing"] - r["split"]["hop_wait"] < 1.0
    ratios.sort()
    # median within 10% (single requests can oversleep on a busy machine)
    assert ratios[len(ratios) // 2] == pytest.approx(1.0, rel=0.10), ratios


def test_queueing_rises_with_more_users_than_slots_while_inference_stays(tmp_path_factory, tmp_path):
    srv = Server(
        tmp_path_factory.mktemp("syn2"),
        "--engine",
        "synthetic",
        "--prefill-ms-per-token",
        "0.05",
        "--decode-ms-per-token",
        "4",
        "--max-batch-size",
        "2",
    )
    try:
        few, many = tmp_path / "u1", tmp_path / "u8"
        common = ["-H", f"grpc://{srv.grpc_target}", "-t", "3s", "--max-tokens", "8", "--tokenizer", "none"]
        run_load(few, *common, "-u", "1", "-r", "1")
        run_load(many, *common, "-u", "8", "-r", "8")
    finally:
        srv.stop()
    s1 = json.loads((few / "summary.json").read_text())["routes"]["grpc.Generate"]["metrics"]
    s8 = json.loads((many / "summary.json").read_text())["routes"]["grpc.Generate"]["metrics"]
    # 8 users on 2 slots: about 3 requests ahead of each one, ~30 ms each
    assert s8["queueing"]["p50"] > 20.0
    assert s1["queueing"]["p50"] < 1.0
    assert s8["inference"]["p50"] == pytest.approx(s1["inference"]["p50"], rel=0.15)


def test_open_loop_records_schedule_lag_and_latency_from_intended_time(synthetic_server, tmp_path):
    # one user, ~20 ms per request (16 tokens x 1 ms + prefill), asked for 100 req/s: it falls behind
    run_load(
        tmp_path,
        "-H",
        f"grpc://{synthetic_server.grpc_target}",
        "-u",
        "1",
        "-r",
        "1",
        "-t",
        "3s",
        "--max-tokens",
        "16",
        "--tokenizer",
        "none",
        "--arrival",
        "constant",
        "--rate",
        "100",
    )
    recs = [r for r in load_records(tmp_path) if r["ok"]]
    lags = [r["schedule_lag_ms"] for r in recs]
    assert max(lags) > 200.0 and lags[-1] > lags[0]
    for r in recs:
        assert r["latency_ms"] == pytest.approx(r["e2e_ms"] + r["schedule_lag_ms"])
        assert sum(r["split"][s] for s in SEGMENTS) == pytest.approx(r["e2e_ms"], abs=1e-6)
    summary = json.loads((tmp_path / "summary.json").read_text())
    m = summary["routes"]["grpc.Generate"]["metrics"]
    assert m["latency"]["p99"] > m["e2e"]["p99"] + 100
    assert summary["meta"]["arrival"] == "constant" and summary["meta"]["rate"] == 100.0


def test_open_loop_poisson_keeps_the_asked_rate_when_there_is_capacity(synthetic_server, tmp_path):
    run_load(
        tmp_path,
        "-H",
        f"grpc://{synthetic_server.grpc_target}",
        "-u",
        "8",
        "-r",
        "8",
        "-t",
        "4s",
        "--max-tokens",
        "2",
        "--tokenizer",
        "none",
        "--arrival",
        "poisson",
        "--rate",
        "40",
    )
    recs = load_records(tmp_path)
    # ~40/s over ~4 s (spawn and stop edges trimmed by the tolerance)
    assert 100 <= len(recs) <= 220
    assert sorted(r["schedule_lag_ms"] for r in recs)[len(recs) // 2] < 20.0


def test_concurrency_sweep_in_one_command(synthetic_server, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "load",
            "-H",
            f"grpc://{synthetic_server.grpc_target}",
            "--sweep",
            "1,3",
            "-t",
            "2s",
            "--max-tokens",
            "4",
            "--tokenizer",
            "none",
            "--only-summary",
            "-L",
            "WARNING",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode in (0, 1), proc.stderr
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert sweep["users"] == [1, 3]
    assert sweep["runs"]["1"]["meta"]["users"] == 1 and sweep["runs"]["3"]["meta"]["users"] == 3
    assert (tmp_path / "u1" / "records.jsonl").exists() and (tmp_path / "u3" / "records.jsonl").exists()
    assert "concurrency sweep" in proc.stdout


def test_master_and_two_workers_totals_equal_sum_of_workers(synthetic_server, tmp_path):
    port = free_port()
    host = f"grpc://{synthetic_server.grpc_target}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    workers = [
        Proc(
            [
                sys.executable,
                "-m",
                "pathprobe",
                "load",
                "--worker",
                "--master-host",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--tokenizer",
                "none",
                "-L",
                "WARNING",
            ],
            tmp_path / f"worker{i}.log",
            env,
        )
        for i in range(2)
    ]
    try:
        master = subprocess.run(
            [
                sys.executable,
                "-m",
                "pathprobe",
                "load",
                "--master",
                "--master-bind-host",
                "127.0.0.1",
                "--master-bind-port",
                str(port),
                "--expect-workers",
                "2",
                "--headless",
                "-H",
                host,
                "-u",
                "4",
                "-r",
                "4",
                "-t",
                "4s",
                "--max-tokens",
                "4",
                "--tokenizer",
                "none",
                "--stream",
                "--arrival",
                "constant",
                "--rate",
                "40",
                "--out",
                str(tmp_path / "out"),
                "--only-summary",
                "-L",
                "WARNING",
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert master.returncode in (0, 1), master.stdout + master.stderr
        for w in workers:
            w.popen.wait(30)
    finally:
        for w in workers:
            w.stop()
    out = tmp_path / "out"
    total = json.loads((out / "summary.json").read_text())
    parts = [json.loads(p.read_text()) for p in sorted(out.glob("worker-*.json"))]
    assert len(parts) == 2, [w.log() for w in workers]
    assert all(p["totals"]["requests"] > 0 for p in parts)
    for key in ("requests", "ok", "errors", "stopped"):
        assert total["totals"][key] == sum(p["totals"][key] for p in parts)
    route = "grpc.GenerateStream"
    for m in ("e2e", "network", "inference", "ttft", "itl"):
        assert total["routes"][route]["metrics"][m]["count"] == sum(
            p["routes"][route]["metrics"][m]["count"] for p in parts
        )
        assert total["routes"][route]["metrics"][m]["max"] == max(
            p["routes"][route]["metrics"][m]["max"] for p in parts
        )
    recs = load_records(out)
    assert len(recs) == total["totals"]["requests"]
    assert {r["worker"] for r in recs} == {"0", "1"}
    # the open-loop rate is the total over both workers (each runs half), not per worker
    assert 100 <= total["totals"]["requests"] <= 200
    assert "grpc.GenerateStream:" in master.stdout


def test_live_view_in_locust_web_ui(synthetic_server, tmp_path):
    web_port = free_port()
    proc = Proc(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "load",
            "-H",
            f"grpc://{synthetic_server.grpc_target}",
            "--autostart",
            "-u",
            "2",
            "-r",
            "2",
            "-t",
            "30s",
            "--web-host",
            "127.0.0.1",
            "--web-port",
            str(web_port),
            "--max-tokens",
            "4",
            "--tokenizer",
            "none",
            "--out",
            str(tmp_path / "out"),
            "-L",
            "WARNING",
        ],
        tmp_path / "web.log",
    )
    base = f"http://127.0.0.1:{web_port}"
    try:
        deadline = time.monotonic() + 60
        data = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/pathprobe/data", timeout=2) as resp:
                    data = json.loads(resp.read())
                if data["totals"]["ok"] > 20:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert data and data["totals"]["ok"] > 20, proc.log()
        first = data["totals"]["ok"]
        time.sleep(1.5)
        with urllib.request.urlopen(f"{base}/pathprobe/data", timeout=5) as resp:
            assert json.loads(resp.read())["totals"]["ok"] > first  # updates during the run
        with urllib.request.urlopen(f"{base}/stats/requests", timeout=5) as resp:
            stats = json.loads(resp.read())
        ext = {e["key"]: e["data"] for e in stats["extendedStats"]}
        rows = ext["pathprobe"]
        assert [r["pct"] for r in rows] == ["p50", "p95", "p99"]
        assert float(rows[0]["inference"]) > 0 and rows[0]["route"].startswith("grpc.Generate")
        with urllib.request.urlopen(f"{base}/pathprobe", timeout=5) as resp:
            page = resp.read().decode()
        assert "pathprobe/data" in page and "stacks the per-segment percentile" in page
        with urllib.request.urlopen(base + "/", timeout=5) as resp:
            assert b"Segments (pathprobe)" in resp.read()
    finally:
        proc.stop()


def test_trace_has_client_server_and_engine_spans(tmp_path_factory, tmp_path, otlp_receiver):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.endpoint}
    srv = Server(tmp_path_factory.mktemp("traced"), "--engine", "synthetic", "--decode-ms-per-token", "1", env=env)
    try:
        run_load(
            tmp_path,
            "-H",
            f"grpc://{srv.grpc_target}",
            "-u",
            "1",
            "-r",
            "1",
            "-t",
            "2s",
            "--max-tokens",
            "3",
            "--tokenizer",
            "none",
            "--traces-file",
            str(tmp_path / "client.jsonl"),
            env=env,
        )
        recs = [r for r in load_records(tmp_path) if r["ok"]]
        assert recs and all(r["trace_id"] for r in recs)
        rec = recs[-1]  # (the first request also pays one-time set-up inside its span)
        tid = bytes.fromhex(rec["trace_id"])

        def complete(spans):
            services = {s for s, sp in spans if sp.trace_id == tid}
            names = {sp.name for _, sp in spans if sp.trace_id == tid}
            return (
                "pathprobe-loadgen" in services and len(services) >= 2 and any(n.startswith("engine.") for n in names)
            )

        otlp_receiver.wait_for(complete, timeout=20)
    finally:
        srv.stop()
    spans = otlp_receiver.trace(tid)
    client = [sp for s, sp in spans if s == "pathprobe-loadgen"]
    assert len(client) == 1 and client[0].kind == 3  # SPAN_KIND_CLIENT
    dur_ms = (client[0].end_time_unix_nano - client[0].start_time_unix_nano) / 1e6
    # the span is placed on the record's clock: it ends at the record's end and starts just
    # before the send (span creation + traceparent injection precede it)
    assert 0 <= dur_ms - rec["e2e_ms"] < 1.0
    attrs = {a.key: a.value for a in client[0].attributes}
    assert attrs["rpc.system"].string_value == "grpc" and attrs["rpc.method"].string_value == "Generate"
    assert attrs["pathprobe.client.encode_ms"].double_value == pytest.approx(rec["client_encode_ms"], abs=1e-3)
    server_side = [sp for s, sp in spans if s != "pathprobe-loadgen"]
    assert any(sp.kind == 2 and sp.parent_span_id == client[0].span_id for sp in server_side)  # SERVER child
    assert any(sp.name.startswith("engine.") for sp in server_side)
    # the same spans also went to the OTLP JSON lines file
    lines = (tmp_path / "client.jsonl").read_text().splitlines()
    assert lines and "resourceSpans" in json.loads(lines[0])
    assert rec["trace_id"] in "".join(lines)


def test_load_through_passthrough_gateway_splits_both_hops(synthetic_server, tmp_path):
    from tests.support.procs import wait_grpc

    port = free_port()
    gw = Proc(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "gateway",
            "--mode",
            "passthrough",
            "--listen",
            f"127.0.0.1:{port}",
            "--upstream",
            synthetic_server.grpc_target,
        ],
        tmp_path / "gw.log",
    )
    try:
        wait_grpc(f"127.0.0.1:{port}", 60, gw.popen)
        run_load(
            tmp_path / "out",
            "-H",
            f"grpc://127.0.0.1:{port}",
            "-u",
            "2",
            "-r",
            "2",
            "-t",
            "2s",
            "--max-tokens",
            "4",
            "--tokenizer",
            "none",
            "--stream",
        )
    finally:
        gw.stop()
    recs = [r for r in load_records(tmp_path / "out") if r["ok"]]
    assert recs
    for r in recs:
        assert "gw.total" in r["entries"] and "srv.total" in r["entries"]
        sp = r["split"]
        e = r["entries"]
        # a stream: the server's waits for gRPC to take each chunk (srv.send) are that link's network
        assert e["srv.send"] > 0
        # and its wait for the request's body after the headers (srv.body, inside its total) too
        link = e["gw.upstream"] - e["srv.total"] + e["srv.send"] + e.get("srv.body", 0.0)
        # less the server's wait before its handler (srv.wait, the time gRPC's core held the call: queueing)
        assert sp["network_hop2"] == pytest.approx(link - min(e.get("srv.wait", 0.0), link))
        assert sp["network"] == pytest.approx(sp["network_hop1"] + sp["network_hop2"])
        assert sum(sp[s] for s in SEGMENTS) == pytest.approx(r["e2e_ms"], abs=1e-6)


def test_load_against_the_tiny_model(tiny_server, tmp_path):
    proc = run_load(
        tmp_path,
        "-H",
        f"grpc://{tiny_server.grpc_target}",
        "-u",
        "1",
        "-r",
        "1",
        "-t",
        "3s",
        "--max-tokens",
        "4",
        "--stream",
    )  # default tokenizer: tiny, prompt of exactly 64 tokens
    recs = [r for r in load_records(tmp_path) if r["ok"]]
    assert recs and "grpc.GenerateStream:" in proc.stdout
    for r in recs:
        assert r["tokens_out"] == 4 and r["tokens_in"] in (64, 65)  # 65: the server may add a BOS token
        assert r["split"]["inference"] > 0 and r["ttft_ms"] > 0
        assert sum(r["split"][s] for s in SEGMENTS) == pytest.approx(r["e2e_ms"], abs=1e-6)


def test_compatible_with_locust_otel(synthetic_server, tmp_path, otlp_receiver):
    # Locust's --otel owns the tracer provider; pathprobe's CLIENT spans go through it
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
    }
    run_load(
        tmp_path,
        "-H",
        f"grpc://{synthetic_server.grpc_target}",
        "-u",
        "1",
        "-r",
        "1",
        "-t",
        "2s",
        "--max-tokens",
        "2",
        "--tokenizer",
        "none",
        "--otel",
        env=env,
    )
    recs = [r for r in load_records(tmp_path) if r["ok"]]
    assert recs and all(r["trace_id"] for r in recs)
    ids = {bytes.fromhex(r["trace_id"]) for r in recs}
    spans = otlp_receiver.wait_for(lambda s: ids <= {sp.trace_id for _, sp in s if sp.kind == 3}, timeout=20)
    assert ids <= {sp.trace_id for _, sp in spans if sp.kind == 3 and sp.name == "grpc.Generate"}
