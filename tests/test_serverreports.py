"""Readers of what third-party servers report about each request (pathprobe.serverreports).

The recorded responses below are copied from each project: vLLM 0.32's own server (captured
from ``/v1/completions`` with ``--enable-per-request-metrics``), TGI's router
(``router/src/server.rs``: ``x-*-time`` headers, ``Duration::as_millis`` as text) and
Ollama's API documentation (``docs/api.md``: ``/api/generate`` without streaming).
"""

from __future__ import annotations

import json

import pytest
from pathprobe import serverreports as sr

VLLM_COMPLETION = json.loads(
    '{"id":"cmpl-a87dd0e5a18d27a9","object":"text_completion","created":1796137153,"model":"tiny",'
    '"choices":[{"index":0,"text":"ess cro cap Augus street gr Writ","logprobs":null,"finish_reason":"length",'
    '"stop_reason":null,"token_ids":null,"prompt_logprobs":null,"prompt_token_ids":null,"routed_experts":null}],'
    '"service_tier":null,"system_fingerprint":"vllm-0.32.0-ea4f1f05","usage":{"prompt_tokens":3,"total_tokens":11,'
    '"completion_tokens":8,"prompt_tokens_details":null,"completion_tokens_details":null},"kv_transfer_params":null,'
    '"ec_transfer_params":null,"metrics":{"time_to_first_token_ms":10.569576000079905,'
    '"generation_time_ms":15.847064000013233,"queue_time_ms":0.03425099998821679,"mean_itl_ms":2.263866285716176,'
    '"tokens_per_second":302.8394224235858,"speculative_decoding":null}}'
)
# the final usage chunk of a stream (choices empty), as vLLM 0.32 sends it
VLLM_STREAM_FINAL = json.loads(
    '{"id":"cmpl-b5dca682a87ff598","object":"text_completion","created":1796137154,"model":"tiny","choices":[],'
    '"usage":{"prompt_tokens":3,"total_tokens":6,"completion_tokens":3},"system_fingerprint":"vllm-0.32.0-ea4f1f05",'
    '"metrics":{"time_to_first_token_ms":9.694971999920199,"generation_time_ms":27.99941000000672,'
    '"queue_time_ms":0.02739100000326289,"mean_itl_ms":13.99970500000336,"tokens_per_second":80.1}}'
)
TGI_HEADERS = {
    "content-type": "application/json",
    "x-compute-type": "1-nvidia-a10g",
    "x-compute-time": "0.412503",
    "x-compute-characters": "21",
    "x-total-time": "412",
    "x-validation-time": "1",
    "x-queue-time": "3",
    "x-inference-time": "408",
    "x-time-per-token": "25",
    "x-prompt-tokens": "7",
    "x-generated-tokens": "16",
}
OLLAMA_GENERATE = json.loads(
    '{"model": "llama3.2", "created_at": "2023-08-04T19:22:45.499127Z",'
    ' "response": "The sky is blue because it is the color of the sky.", "done": true, "context": [1, 2, 3],'
    ' "total_duration": 5043500667, "load_duration": 5025959, "prompt_eval_count": 26,'
    ' "prompt_eval_duration": 325953000, "eval_count": 290, "eval_duration": 4709213000}'
)


def test_vllm_metrics_map_onto_queue_prefill_decode_without_a_total() -> None:
    rep = sr.from_vllm(VLLM_COMPLETION)
    assert rep is not None and rep.source == sr.VLLM
    assert rep.entries == {
        "srv.queue": pytest.approx(0.03425099998821679),
        "srv.prefill": pytest.approx(10.569576000079905),  # vLLM 0.32: scheduled -> first token
        "srv.decode_steps": pytest.approx(15.847064000013233),  # first -> last token
    }
    assert not rep.has_total  # engine intervals only: the rest of the server's time stays unsplit
    assert rep.known_ms == pytest.approx(0.03425099998821679 + 10.569576000079905 + 15.847064000013233)
    stream = sr.from_vllm(VLLM_STREAM_FINAL)
    assert stream is not None and stream.entries["srv.decode_steps"] == pytest.approx(27.99941000000672)


def test_tgi_headers_give_total_queue_inference_and_validation() -> None:
    rep = sr.from_tgi(TGI_HEADERS)
    assert rep is not None and rep.source == sr.TGI and rep.has_total
    assert rep.entries == {"srv.total": 412.0, "srv.validation": 1.0, "srv.queue": 3.0, "srv.inference": 408.0}
    # header names are case-insensitive
    assert sr.from_tgi({k.upper(): v for k, v in TGI_HEADERS.items()}) == rep


def test_ollama_durations_are_nanoseconds() -> None:
    rep = sr.from_ollama(OLLAMA_GENERATE)
    assert rep is not None and rep.source == sr.OLLAMA and rep.has_total
    assert rep.entries == {
        "srv.total": pytest.approx(5043.500667),
        "srv.load": pytest.approx(5.025959),  # scheduler wait + model load: other, never queueing
        "srv.prefill": pytest.approx(325.953),
        "srv.decode_steps": pytest.approx(4709.213),
    }


def test_a_response_without_a_report_reads_as_none() -> None:
    plain = {k: v for k, v in VLLM_COMPLETION.items() if k != "metrics"}
    assert sr.read({"content-type": "application/json"}, plain) is None
    assert sr.from_vllm({**plain, "metrics": None}) is None  # vLLM without --enable-per-request-metrics
    assert sr.from_vllm({**plain, "metrics": {"time_to_first_token_ms": None}}) is None
    assert sr.from_ollama({"model": "m", "response": "x", "done": False}) is None  # a stream's middle object
    assert sr.from_tgi({"x-compute-type": "cpu"}) is None


def test_read_finds_each_source() -> None:
    assert sr.read({}, VLLM_COMPLETION).source == sr.VLLM
    assert sr.read(TGI_HEADERS, {"generated_text": "hi"}).source == sr.TGI
    assert sr.read(None, OLLAMA_GENERATE).source == sr.OLLAMA


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: sr.from_vllm({"metrics": {"queue_time_ms": "soon"}}), "metrics.queue_time_ms"),
        (lambda: sr.from_vllm({"metrics": {"generation_time_ms": -1.0}}), "metrics.generation_time_ms"),
        (lambda: sr.from_vllm({"metrics": [1, 2]}), "metrics"),
        (lambda: sr.from_tgi({"x-total-time": "12", "x-queue-time": "n/a"}), "x-queue-time"),
        (lambda: sr.from_ollama({"total_duration": 10, "eval_duration": True}), "eval_duration"),
        (lambda: sr.from_ollama({"total_duration": float("nan")}), "total_duration"),
    ],
)
def test_an_unreadable_report_is_an_error_naming_the_field(call, field) -> None:
    with pytest.raises(sr.ReportError, match=field):
        call()


# --- onto the segments ---------------------------------------------------------------------------
SEGS = ("network", "serialization", "queueing", "inference", "other", "unsplit")


def _adds_up(s) -> None:
    assert sum(getattr(s, k) for k in SEGS) == pytest.approx(s.e2e, abs=1e-9)


def test_a_server_that_reports_nothing_is_unsplit_with_the_estimate_as_network() -> None:
    s = sr.split(25.0, {}, None, 0.2, 0.3, network_estimate_ms=0.1)
    _adds_up(s)
    assert s.unsplit == pytest.approx(24.4) and s.network == pytest.approx(0.1) and s.network_estimated
    assert s.queueing == s.inference == s.other == 0.0
    s = sr.split(25.0, {}, None, 0.2, 0.3)  # nothing measured on the link: all of it unsplit
    assert s.unsplit == pytest.approx(24.5) and s.network == 0.0 and not s.network_estimated


def test_a_report_with_a_total_is_a_server_hop() -> None:
    rep = sr.from_tgi(TGI_HEADERS)  # total 412 = validation 1 + queue 3 + inference 408
    s = sr.split(413.5, {}, rep, 0.2, 0.3, network_estimate_ms=0.1)
    _adds_up(s)
    assert s.queueing == 3.0 and s.inference == 408.0 and s.other == pytest.approx(1.0)
    assert s.network == pytest.approx(1.0) and not s.network_estimated and s.unsplit == 0.0
    rep = sr.from_ollama(OLLAMA_GENERATE)
    s = sr.split(5045.0, {}, rep)
    _adds_up(s)
    assert s.inference == pytest.approx(325.953 + 4709.213) and s.queueing == 0.0
    assert s.other == pytest.approx(5043.500667 - 325.953 - 4709.213)  # load_duration and the rest


def test_a_report_without_a_total_books_only_what_it_measured() -> None:
    rep = sr.from_vllm(VLLM_COMPLETION)  # queue 0.034, prefill 10.57, decode 15.85: 26.45 ms
    s = sr.split(30.0, {}, rep, 0.2, 0.3, network_estimate_ms=0.1)
    _adds_up(s)
    assert s.queueing == pytest.approx(0.03425099998821679)
    assert s.inference == pytest.approx(10.569576000079905 + 15.847064000013233)
    assert s.network == pytest.approx(0.1) and s.network_estimated
    assert s.unsplit == pytest.approx(30.0 - 0.5 - 0.1 - rep.known_ms)  # vLLM's HTTP, tokenizing, output
    # the estimate never eats what the server measured
    s = sr.split(27.0, {}, rep, 0.2, 0.3, network_estimate_ms=5.0)
    _adds_up(s)
    assert s.inference == pytest.approx(10.569576000079905 + 15.847064000013233) and s.unsplit == pytest.approx(0.0)
    # a report that claims more than the client saw is not booked
    s = sr.split(10.0, {}, rep, 0.2, 0.3)
    _adds_up(s)
    assert s.queueing == 0.0 and s.inference == 0.0 and s.unsplit == pytest.approx(9.5)


def test_behind_a_reporting_gateway_the_inner_link_is_unsplit() -> None:
    from pathprobe import timing

    chain = timing.parse_chain("gw.decode;dur=0.1, gw.upstream;dur=28.0, gw.encode;dur=0.1, gw.total;dur=28.5")
    rep = sr.from_vllm(VLLM_COMPLETION)
    s = sr.split(29.5, chain, rep, 0.2, 0.3)
    _adds_up(s)
    assert s.network_hop1 == pytest.approx(0.5) and s.serialization == pytest.approx(0.7)
    assert s.other == pytest.approx(0.3)  # the gateway's own time
    assert s.inference + s.queueing == pytest.approx(rep.known_ms)
    assert s.unsplit == pytest.approx(28.0 - rep.known_ms)


def test_vllm_llm_request_span_attributes_are_seconds() -> None:
    # attribute names and units as vLLM 0.32's output processor sets them (v1/engine/output_processor.py)
    attrs = {
        "gen_ai.latency.time_to_first_token": 0.0121,
        "gen_ai.latency.e2e": 0.0302,
        "gen_ai.latency.time_in_queue": 0.00004,
        "gen_ai.usage.prompt_tokens": 16,
        "gen_ai.usage.completion_tokens": 8,
        "gen_ai.latency.time_in_model_prefill": 0.0105,
        "gen_ai.latency.time_in_model_decode": 0.0158,
        "gen_ai.latency.time_in_model_inference": 0.0263,
        "gen_ai.request.id": "cmpl-1",
    }
    rep = sr.from_vllm_span(attrs)
    assert rep is not None and rep.source == sr.VLLM_TRACE and not rep.has_total
    assert rep.entries == {
        "srv.queue": pytest.approx(0.04),
        "srv.prefill": pytest.approx(10.5),
        "srv.decode_steps": pytest.approx(15.8),
    }
    assert sr.from_vllm_span({"gen_ai.request.id": "x"}) is None
    with pytest.raises(sr.ReportError, match=r"gen_ai\.latency\.time_in_queue"):
        sr.from_vllm_span({"gen_ai.latency.time_in_queue": "soon"})


def test_vllm_cpu_defaults_give_way_to_what_is_set() -> None:
    from pathprobe import vllmcpu

    assert vllmcpu.kv_cache_gib(24 << 30) == 1 and vllmcpu.kv_cache_gib(256 << 30) == 8
    assert vllmcpu.kv_cache_gib(1 << 30) == 1
    env = vllmcpu.cpu_env({"PATHPROBE_VLLM_SCRATCH": "/scratch"})
    assert env["VLLM_CACHE_ROOT"] == "/scratch/vllm_cache_root" and env["VLLM_CPU_KVCACHE_SPACE"].isdigit()
    mine = {"VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_CACHE_ROOT": "/a", "TORCHINDUCTOR_CACHE_DIR": "/b"}
    assert vllmcpu.cpu_env(mine) == {}
    cmd = vllmcpu.server_command("/m", 8001, served_name="tiny", otlp_traces_endpoint="http://127.0.0.1:4317")
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]  # vllm-cpu's `vllm` script fails
    for flag in ("--enable-per-request-metrics", "--max-model-len", "--otlp-traces-endpoint"):
        assert flag in cmd


def test_the_estimate_is_flagged_on_its_own_link_only() -> None:
    """A chain where only the last hop is silent: client -> gateway measured, gateway -> server estimated."""
    from pathprobe.analysis.report.hops import summarize_hops

    gw = {"gw.total": 24.0, "gw.upstream": 22.0, "gw.connect": 0.2}
    s = sr.split(25.5, gw, None, 0.2, 0.3, network_estimate_ms=sr.network_estimate(gw, 0.9))
    _adds_up(s)
    assert s.links == pytest.approx((1.0, 0.2)) and s.links_estimated == (False, True) and s.network_estimated
    assert s.unsplit == pytest.approx(21.8) and sr.network_estimate_kind(gw, "http-null-rtt") == "gw.connect"
    direct = sr.split(25.0, {}, None, 0.2, 0.3, network_estimate_ms=0.9)
    assert direct.links_estimated == (True,) and sr.network_estimate_kind({}, "http-null-rtt") == "http-null-rtt"
    ours = sr.split(25.0, {"srv.total": 23.0, "srv.queue": 1.0}, None, 0.2, 0.3, network_estimate_ms=0.9)
    assert ours.links_estimated == (False,) and not ours.network_estimated
    assert sr.network_estimate_kind({"srv.total": 23.0}, "http-null-rtt") is None
    # the hop-by-hop summary marks the estimated link only
    path = summarize_hops([{"ok": True, "split": s.as_dict()}])
    assert [link["estimated"] for link in path["links"]] == [0, 1]
    assert [link["mean_ms"] for link in path["links"]] == pytest.approx([1.0, 0.2])
