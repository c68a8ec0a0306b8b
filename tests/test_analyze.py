"""`pathprobe analyze` on a real run: server + gateway + `pathprobe load --traces-file`, then the
split from traces is checked against the in-band split of the same requests."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pathprobe.analysis.report import traces as tr
from pathprobe.analysis.report.records import agreement, read_records, within
from pathprobe.analysis.report.tracesplit import split_trace
from pathprobe.segments import SEGMENTS

from tests.support.procs import Proc, Server, free_port, wait_grpc

SERVER_SIDE = ("serialization", "queueing", "inference")
SEGMENTS_AND_HOPS = ("e2e", *SEGMENTS, "network_hop1", "network_hop2")


def _load(tmp: Path, host: str, name: str) -> Path:
    out = tmp / f"load-{name}"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "load",
            "--headless",
            "-H",
            host,
            "-u",
            "2",
            "-r",
            "2",
            "-t",
            "2s",
            "--out",
            str(out),
            "--traces-file",
            str(tmp / f"client-{name}.jsonl"),
            "--max-tokens",
            "8",
            "--only-summary",
            "--loglevel",
            "WARNING",
            "--exit-code-on-error",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert (out / "records.jsonl").exists(), res.stdout[-2000:] + res.stderr[-2000:]
    return out / "records.jsonl"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("analyze")
    srv = Server(
        tmp,
        "--engine",
        "synthetic",
        "--decode-ms-per-token",
        "1",
        "--prefill-ms-per-token",
        "0.02",
        "--traces-file",
        str(tmp / "server.jsonl"),
    )
    gw_port = free_port()
    gw = Proc(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "gateway",
            "--mode",
            "passthrough",
            "--listen",
            f"127.0.0.1:{gw_port}",
            "--upstream",
            srv.grpc_target,
            "--traces-file",
            str(tmp / "gateway.jsonl"),
        ],
        tmp / "gateway.log",
    )
    try:
        wait_grpc(f"127.0.0.1:{gw_port}", 60, gw.popen)
        recs = {
            "grpc": _load(tmp, f"grpc://{srv.grpc_target}", "grpc"),
            "http": _load(tmp, srv.http_url, "http"),
            "passthrough": _load(tmp, f"grpc://127.0.0.1:{gw_port}", "passthrough"),
        }
        time.sleep(1.5)  # server and gateway export every 0.5 s
    finally:
        gw.stop()
        srv.stop()
    return tmp, recs


def _analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pathprobe", "analyze", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("name", ["grpc", "http"])
def test_analyze_equals_inband_split(run, name):
    tmp, recs = run
    out = tmp / f"analysis-{name}.json"
    res = _analyze(
        str(tmp / "server.jsonl"), str(tmp / f"client-{name}.jsonl"), "--records", str(recs[name]), "--json", str(out)
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "AGREE" in res.stdout
    agr = json.loads(out.read_text())["agreement"]
    ok = [r for r in read_records(recs[name]) if r["ok"]]
    assert len(ok) >= 20 and agr["matched"] == len(ok)  # every request has its trace, rebuilt and split
    for seg, st in agr["segments"].items():
        assert st["outside"] == 0 and st["n"] == len(ok), seg
    # the per-route table is printed
    assert "| grpc.Generate |" in res.stdout or "| http.generate |" in res.stdout


@pytest.mark.parametrize("name", ["grpc", "http"])
def test_durations_alone_agree(run, name):
    """Span timing alone (no recorded values): the server's segments agree on every request, and
    e2e/network on nearly all (the client span ends after the record is built; gevent may switch)."""
    tmp, recs = run
    spans = tr.read_spans([tmp / "server.jsonl", tmp / f"client-{name}.jsonl"])
    splits = [split_trace(t, "durations") for t in tr.group_traces(spans).values()]
    agr = agreement(splits, read_records(recs[name]))
    for seg in SERVER_SIDE + ("other",):
        assert agr["segments"][seg]["outside"] == 0, (seg, agr["segments"][seg])
    by_id = {r["trace_id"]: r for r in read_records(recs[name]) if r["ok"]}
    for seg in ("e2e", "network"):
        st = agr["segments"][seg]
        diffs = sorted(
            abs(s.split.as_dict()[seg] - by_id[s.trace_id]["split"][seg]) for s in splits if s.trace_id in by_id
        )
        assert diffs[len(diffs) // 2] <= 0.2, (seg, st)  # the typical request agrees to 0.2 ms
        assert st["outside"] <= 0.15 * st["n"], (seg, st)


def test_gateway_trace_chains_client_gateway_server(run):
    tmp, recs = run
    spans = tr.read_spans([tmp / "server.jsonl", tmp / "gateway.jsonl", tmp / "client-passthrough.jsonl"])
    traces = tr.group_traces(spans)
    by_id = {r["trace_id"]: r for r in read_records(recs["passthrough"]) if r["ok"]}
    assert len(by_id) >= 20
    exact = False
    for tid, rec in by_id.items():
        ts = split_trace(traces[tid])
        assert [h.split(":")[0] for h in ts.hops] == ["client", "gateway", "server"], ts.hops
        mine, theirs = ts.split.as_dict(), rec["split"]
        for seg in ("e2e", *SERVER_SIDE):
            assert within(mine[seg], theirs[seg]), (seg, mine[seg], theirs[seg])
        # network + other is fixed by the rest; how it divides depends on the gateway's span timing
        assert within(mine["network"] + mine["other"], theirs["network"] + theirs["other"])
        gw_span = next(s for s in traces[tid].spans if s.service == "pathprobe-gateway" and s.kind == "SERVER")
        if "server_timing" in gw_span.attributes:  # the gateway recorded its exact values
            exact = True
            for seg in ("network", "other", "network_hop1", "network_hop2"):
                assert within(mine[seg], theirs[seg]), (seg, mine[seg], theirs[seg])
    print("gateway spans carry server_timing:", exact)


def test_written_trace_opens_as_jaeger_json_and_reads_back(run, tmp_path):
    tmp, recs = run
    files = [str(tmp / "server.jsonl"), str(tmp / "gateway.jsonl"), str(tmp / "client-passthrough.jsonl")]
    res = _analyze(*files, "--write-trace", "slowest:3", "--out", str(tmp_path / "j"))
    assert res.returncode == 0, res.stderr
    written = sorted((tmp_path / "j").glob("trace-*.json"))
    assert len(written) == 3
    doc = json.loads(written[0].read_text())
    (trace,) = doc["data"]
    assert {p["serviceName"] for p in trace["processes"].values()} == {
        "pathprobe-loadgen",
        "pathprobe-gateway",
        "pathprobe-server",
    }
    for sp in trace["spans"]:
        assert len(sp["traceID"]) == 32 and len(sp["spanID"]) == 16 and sp["processID"] in trace["processes"]
        assert isinstance(sp["startTime"], int) and isinstance(sp["duration"], int)
    names = {sp["operationName"] for sp in trace["spans"]}
    assert {"engine.decode_steps", "engine.queue", "server.decode"} <= names
    # reading the Jaeger file back gives the same split as the OTLP source (µs resolution)
    original = {t.trace_id: t for t in tr.group_traces(tr.read_spans(files)).values()}
    for f in written:
        (back,) = tr.group_traces(tr.read_spans([f])).values()
        a, b = split_trace(back).split.as_dict(), split_trace(original[back.trace_id]).split.as_dict()
        for k in SEGMENTS_AND_HOPS:
            assert abs(a[k] - b[k]) < 0.01, k
        assert a["links"] == pytest.approx(b["links"], abs=0.01)
    # OTLP output too, readable by the same reader
    res = _analyze(*files, "--write-trace", "slowest:1", "--out", str(tmp_path / "o"), "--format", "otlp")
    (f,) = (tmp_path / "o").glob("*.json")
    assert "resourceSpans" in json.loads(f.read_text().splitlines()[0])


def test_collector_style_base64_ids_and_jaeger_query_api(run, tmp_path):
    """Jaeger's /api/v3/traces answers ``{"result": <OTLP JSON>}``; a collector may write ids in base64.
    A stand-in HTTP server replays our exported spans in that shape (no Jaeger binary here)."""
    tmp, recs = run
    docs = []
    for name in ("server.jsonl", "client-grpc.jsonl"):
        for line in (tmp / name).read_text().splitlines():
            doc = json.loads(line)
            for rs in doc["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        for key in ("traceId", "spanId", "parentSpanId"):
                            if sp.get(key):
                                sp[key] = base64.b64encode(bytes.fromhex(sp[key])).decode()
            docs.append(doc)
    merged = {"resourceSpans": [rs for d in docs for rs in d["resourceSpans"]]}
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            if not self.path.startswith("/api/v3/traces"):
                self.send_error(404)
                return
            body = json.dumps({"result": merged}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        res = _analyze("--jaeger", url, "--service", "pathprobe-loadgen", "--records", str(recs["grpc"]))
    finally:
        httpd.shutdown()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "AGREE" in res.stdout
    assert seen and "query.service_name=pathprobe-loadgen" in seen[0]
    missing = _analyze("--jaeger", url)
    assert missing.returncode == 2 and "--jaeger needs --service" in missing.stderr


def test_bad_inputs(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"resourceSpans": [}')
    res = _analyze(str(bad))
    assert res.returncode == 2 and "bad.json: not valid JSON at line 1" in res.stderr
    res = _analyze()
    assert res.returncode == 2 and "give trace files" in res.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert _analyze(str(empty)).returncode == 1
