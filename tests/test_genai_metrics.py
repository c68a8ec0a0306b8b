"""OpenTelemetry's GenAI metrics, read back where a dashboard reads them: the load generator's
``gen_ai.client.*`` and the server's ``gen_ai.server.*`` in the OTLP JSON export and on the
Prometheus pages, with the conventions' names, units and bucket sets, and counts equal to the
records of the run (every request once, every stream gap once)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pathprobe import genai
from pathprobe.loadgen.metrics import LoadMetrics
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.procs import Server
from tests.test_load_e2e import load_records, run_load

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A synthetic server exporting its metrics to a file, and one load run (a gRPC stream and an
    OpenAI chat stream interleaved, plus unary calls) exporting the client's to another."""
    tmp = tmp_path_factory.mktemp("genai")
    server_file = tmp / "server-metrics.jsonl"
    srv = Server(
        tmp,
        *("--engine", "synthetic", "--prefill-ms-per-token", "0.05", "--decode-ms-per-token", "1"),
        env={"PATHPROBE_METRICS_FILE": str(server_file)},
    )
    try:
        client_file = tmp / "client-metrics.jsonl"
        out = tmp / "load"
        grpc_url = f"grpc://{srv.grpc_target}"
        mix = f"g={grpc_url},o=openai+{srv.http_url}"
        run_load(
            out,
            *("-H", grpc_url, "--mix", mix, "--stream", "-u", "2", "-r", "2", "-t", "2s", "--max-tokens", "5"),
            *("--tokenizer", "none", "--openai-api", "chat"),
            env={"PATHPROBE_METRICS_FILE": str(client_file)},
        )
        page = urllib.request.urlopen(f"{srv.http_url}/metrics", timeout=10).read().decode()
        yield {"srv": srv, "records": load_records(out), "client_file": client_file, "page": page}
    finally:
        srv.stop()


def _otlp_histograms(path: Path) -> dict[str, dict[str, Any]]:
    """name -> the metric of the LAST export (cumulative: it holds every observation)."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    assert lines, f"no OTLP export in {path}"
    out: dict[str, dict[str, Any]] = {}
    for rm in lines[-1]["resourceMetrics"]:
        for sm in rm["scopeMetrics"]:
            for metric in sm["metrics"]:
                out[metric["name"]] = metric
    return out


def _count(metric: dict[str, Any], where: dict[str, str] | None = None) -> int:
    points = metric["histogram"]["dataPoints"]
    total = 0
    for p in points:
        attrs = {a["key"]: next(iter(a["value"].values())) for a in p.get("attributes", [])}
        if all(attrs.get(k) == v for k, v in (where or {}).items()):
            total += int(p.get("count", 0))
    return total


def _check_shape(metric: dict[str, Any], ins: genai.Instrument) -> None:
    assert metric["unit"] == ins.unit, ins.name
    for p in metric["histogram"]["dataPoints"]:
        assert [float(b) for b in p["explicitBounds"]] == [float(b) for b in ins.buckets], ins.name
        assert metric["histogram"]["aggregationTemporality"] == "AGGREGATION_TEMPORALITY_CUMULATIVE"


def test_client_otlp_export_counts_every_record(run: dict[str, Any]) -> None:
    records = run["records"]
    ok = [r for r in records if r["ok"]]
    assert len(ok) > 10 and {r["route"] for r in ok} == {"grpc.GenerateStream", "openai.chat.stream"}
    hist = _otlp_histograms(run["client_file"])
    for ins in genai.CLIENT_INSTRUMENTS:
        _check_shape(hist[ins.name], ins)
    assert _count(hist[genai.CLIENT_DURATION.name]) == len(records)
    assert _count(hist[genai.CLIENT_DURATION.name], {"gen_ai.operation.name": "chat"}) == sum(
        r["route"].startswith("openai.chat") for r in records
    )
    assert _count(hist[genai.CLIENT_TTFC.name]) == sum(r["ttft_ms"] is not None for r in ok)
    assert _count(hist[genai.CLIENT_TPOC.name]) == sum(len(r["itl_ms"]) for r in ok) > 0
    assert _count(hist[genai.CLIENT_TOKENS.name], {"gen_ai.token.type": "output"}) == sum(
        r["tokens_out"] is not None for r in ok
    )
    # the sum is the records' e2e in seconds: the unit is right, not only the name
    total_s = sum(float(p["sum"]) for p in hist[genai.CLIENT_DURATION.name]["histogram"]["dataPoints"])
    assert total_s == pytest.approx(sum(r["e2e_ms"] for r in records) / 1e3, rel=1e-6)


def test_client_prometheus_page_has_the_conventions_names(run: dict[str, Any]) -> None:
    """The page ``--metrics-port`` serves, made from the same records by the same code."""
    records = run["records"]
    metrics = LoadMetrics("t")
    metrics.observe(records)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}
    fam = families["gen_ai_client_operation_duration_seconds"]
    assert fam.type == "histogram"  # the unit is the name's suffix (the text format has no UNIT line)
    buckets = sorted({float(s.labels["le"]) for s in fam.samples if s.name.endswith("_bucket")})
    assert buckets == [*map(float, genai.DURATION_BUCKETS), float("inf")]
    count = sum(s.value for s in fam.samples if s.name.endswith("_count"))
    assert count == len(records)
    assert {"gen_ai_operation_name", "gen_ai_provider_name", "server_address", "server_port"} <= fam.samples[
        0
    ].labels.keys()
    gaps = families["gen_ai_client_operation_time_per_output_chunk_seconds"]
    assert sum(s.value for s in gaps.samples if s.name.endswith("_count")) == sum(len(r["itl_ms"]) for r in records)


def test_server_page_and_export_count_every_request(run: dict[str, Any]) -> None:
    records = run["records"]
    ok = [r for r in records if r["ok"]]
    families = {f.name: f for f in text_string_to_metric_families(run["page"])}
    fam = families["gen_ai_server_request_duration_seconds"]
    # every request the client sent and got an answer to; a request stopped in flight at the end of
    # the run (status STOPPED) may or may not have reached the server
    stopped = sum(r["status"] == "STOPPED" for r in records)
    counted = sum(s.value for s in fam.samples if s.name.endswith("_count"))
    assert len(records) - stopped <= counted <= len(records)
    ttft = families["gen_ai_server_time_to_first_token_seconds"]
    buckets = sorted({float(s.labels["le"]) for s in ttft.samples if s.name.endswith("_bucket")})
    assert buckets == [*map(float, genai.TTFT_BUCKETS), float("inf")]
    assert len(ok) <= sum(s.value for s in ttft.samples if s.name.endswith("_count")) <= len(ok) + stopped
    tpot = families["gen_ai_server_time_per_output_token_seconds"]
    several = sum((r["tokens_out"] or 0) > 1 for r in ok)
    assert several <= sum(s.value for s in tpot.samples if s.name.endswith("_count")) <= several + stopped
    # the synthetic engine's decode is 1 ms per token: the server's TPOT lands in the first bucket
    # (<= 10 ms), far from 0 and far from a unit slip (1 s)
    tpot_sum = sum(s.value for s in tpot.samples if s.name.endswith("_sum"))
    tpot_n = sum(s.value for s in tpot.samples if s.name.endswith("_count"))
    assert 0.0008 < tpot_sum / tpot_n < 0.01
    assert not any(name.startswith("gen_ai_client") for name in families), "a server records no client metric"


def test_server_otlp_export_after_shutdown(run: dict[str, Any]) -> None:
    """The server's last export is written when it stops (the fixture stopped it after the run)."""
    run["srv"].stop()
    path = Path(run["client_file"]).parent / "server-metrics.jsonl"
    hist = _otlp_histograms(path)
    for ins in genai.SERVER_INSTRUMENTS:
        _check_shape(hist[ins.name], ins)
    records = run["records"]
    stopped = sum(r["status"] == "STOPPED" for r in records)
    assert len(records) - stopped <= _count(hist[genai.SERVER_DURATION.name]) <= len(records)
