"""vLLM's async engine behind pathprobe's interface: `pathprobe serve --engine vllm` on the tiny model.

vLLM is an optional extra (``pip install 'pathprobe[vllm]'``, about 3 GB); the serving
tests run where it is importable and are skipped, with the reason, where it is not.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
from collections.abc import Iterator

import pytest
from pathprobe import timing
from pathprobe.errors import ConfigError
from pathprobe.server.engine.base import EngineConfig
from pathprobe.server.engine.vllm_engine import INSTALL_HINT, _coerce, vllm_available

from tests.support.clients import grpc_generate, grpc_stream, http_post, sse_events
from tests.support.procs import Server

HAS_VLLM = vllm_available()
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason=f"vLLM is not importable here; {INSTALL_HINT}")

NAMED = ("srv.queue", "srv.tokenize", "srv.prefill", "srv.decode_steps", "srv.detokenize", "srv.decode", "srv.encode")


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed: the missing-vLLM error cannot be shown")
def test_missing_vllm_is_a_clear_config_error() -> None:
    from pathprobe.server.engine import create_engine

    with pytest.raises(ConfigError, match=r"pip install 'pathprobe\[vllm\]'"):
        create_engine(EngineConfig(kind="vllm"))


def test_engine_option_values_are_typed() -> None:
    assert _coerce("true") is True and _coerce("off") is False
    assert _coerce("3") == 3 and _coerce("0.5") == 0.5 and _coerce("bfloat16") == "bfloat16"


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory) -> Iterator[Server]:
    # 2 sequences at a time so a burst of 4 has to queue; the KV cache and cache folders are the
    # engine's own CPU defaults (pathprobe.vllmcpu), nothing set by hand
    srv = Server(
        tmp_path_factory.mktemp("vllm"),
        "--engine",
        "vllm",
        "--model",
        "tiny",
        "--max-batch-size",
        "2",
        timeout=600,
    )
    yield srv
    srv.stop()


def assert_split(entries: dict[str, float]) -> None:
    for name in NAMED + ("srv.total",):
        assert name in entries, (name, entries)
    assert entries["srv.prefill"] > 0 and entries["srv.decode_steps"] > 0 and entries["srv.tokenize"] > 0
    assert sum(entries[n] for n in NAMED) <= entries["srv.total"] + 0.01


@needs_vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vllm_serves_tiny_on_every_front_end(vllm_server: Server) -> None:
    fields = {"prompt": "The capital of France is", "max_tokens": 8, "ignore_eos": True}
    resp, entries = grpc_generate(vllm_server.grpc_target, **fields)
    assert resp.usage.completion_tokens == 8 and resp.usage.prompt_tokens == 6 and resp.model == "tiny"
    assert resp.finish_reason == "length"
    assert_split(entries)

    chunks, entries = grpc_stream(vllm_server.grpc_target, **fields)
    assert len([c for c in chunks if c.token_ids]) == 8  # one chunk per token
    assert "".join(c.text for c in chunks) == resp.text  # greedy: same text on every path
    assert_split(entries)

    status, headers, body = http_post(f"{vllm_server.http_url}/v1/generate", fields)
    assert status == 200 and json.loads(body)["text"] == resp.text
    assert_split(timing.parse(headers["Server-Timing"]))

    status, _, body = http_post(f"{vllm_server.http_url}/v1/generate", {**fields, "stream": True})
    events = sse_events(body)
    assert "".join(e["text"] for e in events[:-1]) == resp.text
    assert_split(timing.parse(events[-2]["server_timing"]))

    # a stop string taken from the greedy text: the answer ends right before it
    words = [w for w in resp.text.split() if len(w) >= 3 and resp.text.index(w) > 0]
    if words:
        stop = words[0]
        r2, _ = grpc_generate(vllm_server.grpc_target, **fields, stop=[stop])
        assert r2.text == resp.text[: resp.text.index(stop)] and r2.finish_reason == "stop"

    # bad input is still INVALID_ARGUMENT / 400 naming the field
    status, _, body = http_post(f"{vllm_server.http_url}/v1/generate", {"prompt": "x" * 10, "max_tokens": 5000})
    assert status == 400 and "prompt" in json.loads(body)["error"]["message"]


@needs_vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vllm_queue_grows_beyond_its_sequences(vllm_server: Server) -> None:
    fields = {"prompt": "Hello! How are you", "max_tokens": 24, "ignore_eos": True}

    def one(_: int) -> dict[str, float]:
        return grpc_generate(vllm_server.grpc_target, **fields)[1]

    with cf.ThreadPoolExecutor(4) as pool:
        burst = list(pool.map(one, range(4)))
    queues = sorted(e["srv.queue"] for e in burst)
    decode = min(e["srv.decode_steps"] for e in burst)
    # two of four waited for a free sequence slot, about one whole generation
    assert queues[2] > 0.5 * decode and queues[3] > 0.5 * decode
    alone = one(0)
    assert alone["srv.queue"] < 0.25 * queues[2]


@needs_vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vllm_openai_client(vllm_server: Server) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{vllm_server.http_url}/v1", api_key="none")
    c = client.completions.create(
        model="tiny", prompt="The capital of France is", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert c.usage.completion_tokens == 6
    parts = list(
        client.completions.create(
            model="tiny",
            prompt="The capital of France is",
            max_tokens=6,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(p.choices[0].text for p in parts) == c.choices[0].text


def _gauge(url: str, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


@needs_vllm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vllm_client_disconnect_frees_the_sequence(vllm_server: Server) -> None:
    import time

    import grpc
    from pathprobe.v1 import llm_pb2, llm_pb2_grpc

    with grpc.insecure_channel(vllm_server.grpc_target) as ch:
        stub = llm_pb2_grpc.LLMStub(ch)
        call = stub.GenerateStream(llm_pb2.GenerateRequest(prompt="Once upon a time", max_tokens=800, ignore_eos=True))
        for _, _chunk in zip(range(3), call):
            pass
        assert _gauge(vllm_server.http_url, "pathprobe_server_running") == 1
        call.cancel()
    deadline = time.monotonic() + 20
    while _gauge(vllm_server.http_url, "pathprobe_server_running") != 0:
        assert time.monotonic() < deadline, "the cancelled request still holds a slot"
        time.sleep(0.1)
    assert _gauge(vllm_server.http_url, "pathprobe_server_queue_depth") == 0
    # both sequence slots serve again at once: two requests, no queueing behind the aborted one
    with cf.ThreadPoolExecutor(2) as pool:
        res = list(
            pool.map(
                lambda _: grpc_generate(vllm_server.grpc_target, prompt="Hi", max_tokens=4, ignore_eos=True), range(2)
            )
        )
    assert all(r.usage.completion_tokens == 4 for r, _ in res)
