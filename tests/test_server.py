"""pathprobe serve end to end on loopback: gRPC, native HTTP, OpenAI, timing in-band."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from pathprobe import timing
from pathprobe.timing import SERVER_ENTRIES
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

from tests.support.clients import grpc_generate, grpc_stream, http_post, sse_events
from tests.support.procs import Server

NAMED = ("srv.decode", "srv.queue", "srv.tokenize", "srv.prefill", "srv.decode_steps", "srv.detokenize", "srv.encode")


def assert_complete_split(entries: dict[str, float]) -> None:
    assert set(SERVER_ENTRIES) <= set(entries), f"missing entries: {set(SERVER_ENTRIES) - set(entries)}"
    assert all(v >= 0 for v in entries.values())
    named = sum(entries[n] for n in NAMED)
    # entries are rounded to 1 us each on the wire
    assert named <= entries["srv.total"] + 0.008, entries


def test_grpc_unary(synthetic_server: Server) -> None:
    resp, entries = grpc_generate(
        synthetic_server.grpc_target, prompt="The capital of France is", max_tokens=8, request_id="r1"
    )
    assert resp.usage.completion_tokens == 8 and len(resp.token_ids) == 8
    assert resp.finish_reason == "length" and resp.request_id == "r1" and resp.text
    assert_complete_split(entries)


def test_grpc_stream_matches_unary(synthetic_server: Server) -> None:
    resp, _ = grpc_generate(synthetic_server.grpc_target, prompt="hello", max_tokens=6)
    chunks, entries = grpc_stream(synthetic_server.grpc_target, prompt="hello", max_tokens=6)
    assert len(chunks) == 6
    assert "".join(c.text for c in chunks) == resp.text
    assert [c.index for c in chunks] == list(range(6))
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 6
    assert_complete_split(entries)


def test_http_native_unary_and_sse(http_server: Server) -> None:
    synthetic_server = http_server
    url = f"{synthetic_server.http_url}/v1/generate"
    status, headers, body = http_post(url, {"prompt": "hello", "max_tokens": 6})
    assert status == 200
    obj = json.loads(body)
    assert obj["usage"] == {"prompt_tokens": obj["usage"]["prompt_tokens"], "completion_tokens": 6, "cached_tokens": 0}
    assert_complete_split(timing.parse(headers["Server-Timing"]))
    resp, _ = grpc_generate(synthetic_server.grpc_target, prompt="hello", max_tokens=6)
    assert obj["text"] == resp.text and obj["token_ids"] == list(resp.token_ids)

    status, headers, body = http_post(url, {"prompt": "hello", "max_tokens": 6, "stream": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == 6 and "".join(c["text"] for c in chunks) == resp.text
    assert "server_timing" in chunks[-1] and all("server_timing" not in c for c in chunks[:-1])
    assert_complete_split(timing.parse(chunks[-1]["server_timing"]))


def test_openai_client_completions_and_chat(http_server: Server) -> None:
    synthetic_server = http_server
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{synthetic_server.http_url}/v1", api_key="none")
    models = client.models.list()
    name = models.data[0].id
    raw = client.completions.with_raw_response.create(model=name, prompt="hello", max_tokens=5)
    c = raw.parse()
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 5
    assert_complete_split(timing.parse(raw.headers["server-timing"]))

    chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.usage.completion_tokens == 4

    stream = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 4
    assert_complete_split(timing.parse(chunks[-1].model_extra["server_timing"]))

    stream = client.completions.create(model=name, prompt="hello", max_tokens=5, stream=True)
    parts = list(stream)
    assert "".join(p.choices[0].text for p in parts) == c.choices[0].text
    assert parts[-1].choices[0].finish_reason == "length"
    assert_complete_split(timing.parse(parts[-1].model_extra["server_timing"]))


@pytest.fixture(scope="module")
def timed_server(tmp_path_factory):
    srv = Server(
        tmp_path_factory.mktemp("timed"),
        "--engine",
        "synthetic",
        "--prefill-ms-per-token",
        "0.5",
        "--decode-ms-per-token",
        "5",
        "--max-batch-size",
        "2",
        "--max-queue",
        "64",
    )
    yield srv
    srv.stop()


def test_synthetic_times_match_configuration(timed_server: Server) -> None:
    import statistics

    prompt_ids = list(range(10, 50))  # 40 tokens -> 20 ms prefill
    grpc_generate(timed_server.grpc_target, prompt_token_ids=prompt_ids, max_tokens=2)  # warm-up
    runs = [grpc_generate(timed_server.grpc_target, prompt_token_ids=prompt_ids, max_tokens=21)[1] for _ in range(5)]
    prefill = statistics.median(e["srv.prefill"] for e in runs)
    decode = statistics.median(e["srv.decode_steps"] for e in runs)
    assert prefill == pytest.approx(40 * 0.5, rel=0.10)
    # the first token comes out of prefill; 20 decode steps of 5 ms follow
    assert decode == pytest.approx(20 * 5, rel=0.10)
    assert all(e["srv.queue"] < 2.0 for e in runs)


def _generate_together(target: str, n: int) -> list[dict[str, float]]:
    """n unary calls released at once: channels connected first, then a barrier, so none
    arrives late because its thread was still opening a connection."""
    barrier = threading.Barrier(n)
    channels = [grpc.insecure_channel(target) for _ in range(n)]
    for ch in channels:
        grpc.channel_ready_future(ch).result(timeout=10)

    def call(ch: grpc.Channel) -> dict[str, float]:
        stub = llm_pb2_grpc.LLMStub(ch)
        barrier.wait(timeout=10)
        _, c = stub.Generate.with_call(llm_pb2.GenerateRequest(prompt="hi", max_tokens=11), timeout=30)
        return timing.from_metadata(c.trailing_metadata())

    try:
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(call, channels))
    finally:
        for ch in channels:
            ch.close()


def test_queue_grows_only_beyond_batch_slots(timed_server: Server) -> None:
    within = _generate_together(timed_server.grpc_target, 2)
    assert max(e["srv.queue"] for e in within) < 5.0
    beyond = _generate_together(timed_server.grpc_target, 6)
    queues = sorted(e["srv.queue"] for e in beyond)
    # 6 requests at once, 2 slots, ~50 ms per generation: two start at once, the other four
    # wait for a slot (about one and two generations)
    assert queues[2] > 25.0, queues
    assert queues[-1] > 60.0, queues
    assert all(e["srv.decode_steps"] == pytest.approx(50, rel=0.15) for e in beyond)


BAD_GRPC = [
    ({"prompt": "", "max_tokens": 4}, "prompt"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 10_000_000}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 4, "temperature": 2.5}, "temperature"),
    ({"prompt": "hi", "max_tokens": 4, "temperature": float("nan")}, "temperature"),
    ({"prompt": "hi", "max_tokens": 4, "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "max_tokens": 4, "model": "no-such-model"}, "model"),
    ({"prompt": "word " * 5000, "max_tokens": 4}, "prompt"),
    ({"prompt_token_ids": [1, 99_999_999], "max_tokens": 4}, "prompt_token_ids[1]"),
]


@pytest.mark.parametrize(("fields", "field"), BAD_GRPC)
def test_grpc_bad_input(synthetic_server: Server, fields: dict, field: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        grpc_generate(synthetic_server.grpc_target, **fields)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(field), info.value.details()
    assert "srv.total" in timing.from_metadata(info.value.trailing_metadata())
    # still serving
    assert grpc_generate(synthetic_server.grpc_target, prompt="ok", max_tokens=1)[0].usage.completion_tokens == 1


def test_grpc_undecodable_payload(synthetic_server: Server) -> None:
    with grpc.insecure_channel(synthetic_server.grpc_target) as ch:
        call = ch.unary_unary("/pathprobe.v1.LLM/Generate")
        with pytest.raises(grpc.RpcError) as info:
            call(b"\xff\xff\xff\xff not protobuf", timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "request" in info.value.details()


BAD_HTTP = [
    ("/v1/generate", b"{not json", "body"),
    ("/v1/generate", b"[1, 2]", "body"),
    ("/v1/generate", json.dumps({"prompt": "hi", "max_tokens": "4"}).encode(), "max_tokens"),
    ("/v1/generate", json.dumps({"prompt": 7, "max_tokens": 4}).encode(), "prompt"),
    ("/v1/generate", json.dumps({"prompt": "hi", "max_tokens": 4, "stream": "yes"}).encode(), "stream"),
    ("/v1/generate", json.dumps({"prompt": "hi", "max_tokens": 4, "top_p": -0.5}).encode(), "top_p"),
    ("/v1/generate", json.dumps({"prompt": "hi", "max_tokens": 4, "bogus": 1}).encode(), "bogus"),
    ("/v1/completions", json.dumps({"prompt": "hi", "max_tokens": "x"}).encode(), "max_tokens"),
    ("/v1/completions", json.dumps({"max_tokens": 3}).encode(), "prompt"),
    ("/v1/completions", json.dumps({"prompt": "hi", "temperature": 9}).encode(), "temperature"),
    ("/v1/completions", json.dumps({"prompt": "hi", "model": "gpt-9"}).encode(), "model"),
    ("/v1/chat/completions", json.dumps({"messages": "hi"}).encode(), "messages"),
    (
        "/v1/chat/completions",
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}).encode(),
        "max_tokens",
    ),
]


@pytest.mark.parametrize(("path", "raw", "field"), BAD_HTTP)
def test_http_bad_input(http_server: Server, path: str, raw: bytes, field: str) -> None:
    synthetic_server = http_server
    status, _, body = http_post(synthetic_server.http_url + path, None, raw=raw)
    assert status == 400, body
    err = json.loads(body)["error"]
    assert err["status"] == "INVALID_ARGUMENT"
    assert err["message"].startswith(field) or (err["param"] or "").startswith(field), err
    status, _, _ = http_post(synthetic_server.http_url + "/v1/generate", {"prompt": "ok", "max_tokens": 1})
    assert status == 200


def test_http_unknown_path_and_too_large(tmp_path, http_front_end: str) -> None:
    srv = Server(tmp_path, "--engine", "synthetic", "--max-body-bytes", "1000", "--http-server", http_front_end)
    try:
        status, _, body = http_post(srv.http_url + "/v1/nope", {"a": 1})
        assert status == 404 and "path" in json.loads(body)["error"]["message"]
        status, _, body = http_post(srv.http_url + "/v1/generate", {"prompt": "x" * 5000, "max_tokens": 1})
        assert status == 413 and json.loads(body)["error"]["status"] == "RESOURCE_EXHAUSTED"
        assert http_post(srv.http_url + "/v1/generate", {"prompt": "ok", "max_tokens": 1})[0] == 200
        req = urllib.request.Request(srv.http_url + "/v1/generate", method="GET")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 405 and "method" in json.loads(info.value.read())["error"]["message"]
    finally:
        srv.stop()


@pytest.mark.parametrize("engine", ["inline", "engine-process"])
def test_full_queue_is_resource_exhausted_and_disconnect_frees_slot(tmp_path, http_front_end: str, engine: str) -> None:
    srv = Server(
        tmp_path,
        "--engine",
        "synthetic",
        "--decode-ms-per-token",
        "20",
        "--max-batch-size",
        "1",
        "--max-queue",
        "1",
        "--http-server",
        http_front_end,
        *(["--engine-process"] if engine == "engine-process" else []),
    )
    try:
        results: list[object] = []

        def call() -> None:
            try:
                grpc_generate(srv.grpc_target, prompt="hi", max_tokens=20)
                results.append("ok")
            except grpc.RpcError as exc:
                results.append(exc.code())

        threads = [threading.Thread(target=call) for _ in range(4)]
        for t in threads:
            t.start()
            time.sleep(0.05)
        status, _, body = http_post(srv.http_url + "/v1/generate", {"prompt": "hi", "max_tokens": 2})
        assert status == 429 and json.loads(body)["error"]["status"] == "RESOURCE_EXHAUSTED"
        for t in threads:
            t.join()
        assert results.count("ok") == 2 and results.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 2

        # a client that disconnects mid-stream must not keep its engine slot
        with grpc.insecure_channel(srv.grpc_target) as ch:
            from pathprobe.v1 import llm_pb2, llm_pb2_grpc

            call = llm_pb2_grpc.LLMStub(ch).GenerateStream(llm_pb2.GenerateRequest(prompt="hi", max_tokens=500))
            next(call)
            call.cancel()
        req = urllib.request.Request(
            srv.http_url + "/v1/generate",
            method="POST",
            data=json.dumps({"prompt": "hi", "max_tokens": 500, "stream": True}).encode(),
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.readline()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            health = json.loads(urllib.request.urlopen(srv.http_url + "/healthz").read())
            if health["running"] == 0 and health["queue_depth"] == 0:
                break
            time.sleep(0.05)
        assert health["running"] == 0 and health["queue_depth"] == 0, health
        _, entries = grpc_generate(srv.grpc_target, prompt="hi", max_tokens=2)
        assert entries["srv.queue"] < 5.0
    finally:
        srv.stop()


def test_metrics_exposed(http_server: Server) -> None:
    synthetic_server = http_server
    grpc_generate(synthetic_server.grpc_target, prompt="hi", max_tokens=2)
    text = urllib.request.urlopen(f"{synthetic_server.http_url}/metrics").read().decode()
    assert 'pathprobe_server_requests_total{code="OK",route="grpc.Generate"}' in text
    assert 'pathprobe_server_segment_ms_bucket{entry="srv.prefill"' in text
    for name in (
        "pathprobe_server_queue_depth",
        "pathprobe_server_running",
        "pathprobe_server_generated_tokens_total",
        "pathprobe_server_batch_size_bucket",
    ):
        assert name in text


def test_deadline_cancels_engine_work(timed_server: Server) -> None:
    with pytest.raises(grpc.RpcError) as info:
        grpc_generate(timed_server.grpc_target, prompt="hi", max_tokens=200, timeout=0.1)  # ~1 s of decoding
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        health = json.loads(urllib.request.urlopen(timed_server.http_url + "/healthz").read())
        if health["running"] == 0:
            break
        time.sleep(0.02)
    assert health["running"] == 0, "the engine kept generating for a caller that is gone"
    text = urllib.request.urlopen(f"{timed_server.http_url}/metrics").read().decode()
    # the engine sees the deadline too: whichever comes first (its own check or grpc's cancel) is counted, once
    assert ('pathprobe_server_requests_total{code="CANCELLED",route="grpc.Generate"} 1.0' in text) != (
        'pathprobe_server_requests_total{code="DEADLINE_EXCEEDED",route="grpc.Generate"} 1.0' in text
    )


def test_sub_millisecond_tokens_are_paced_not_bunched(tmp_path) -> None:
    """At 0.5 ms per token the client sees ~0.5 ms gaps (asyncio.sleep alone bunched them
    into pairs: gaps of ~0 and ~1 ms)."""
    import statistics

    from pathprobe.v1 import llm_pb2, llm_pb2_grpc

    srv = Server(tmp_path, "--engine", "synthetic", "--decode-ms-per-token", "0.5")
    try:
        with grpc.insecure_channel(srv.grpc_target) as ch:
            stub = llm_pb2_grpc.LLMStub(ch)
            medians = []
            for _ in range(3):
                arrivals = [
                    time.perf_counter()
                    for _ in stub.GenerateStream(llm_pb2.GenerateRequest(prompt="hi", max_tokens=60))
                ]
                gaps = [(b - a) * 1e3 for a, b in zip(arrivals[1:], arrivals[2:])]
                medians.append(statistics.median(gaps))
        assert 0.25 < statistics.median(medians) < 0.9, medians
    finally:
        srv.stop()


def test_openapi_document_lists_every_route_with_its_body_schema(http_server: Server) -> None:
    doc = json.loads(urllib.request.urlopen(f"{http_server.http_url}/openapi.json", timeout=10).read())
    assert doc["openapi"].startswith("3.")
    ops = {(path, method) for path, item in doc["paths"].items() for method in item}
    assert {
        ("/v1/generate", "post"),
        ("/v1/completions", "post"),
        ("/v1/chat/completions", "post"),
        ("/v1/models", "get"),
        ("/healthz", "get"),
        ("/metrics", "get"),
    } <= ops
    native = doc["paths"]["/v1/generate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"prompt", "max_tokens", "prompt_token_ids", "stream"} <= set(native["properties"])
    chat = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "messages" in chat["properties"] and "messages" in chat["required"]


def test_no_delayed_ack_stall_on_either_front_end(http_server: Server) -> None:
    """A response written as head + body without TCP_NODELAY waits ~40 ms for the client's
    delayed ACK on every request (seen with uvicorn on a socket it did not create)."""
    import statistics

    took = []
    for _ in range(15):
        t0 = time.perf_counter()
        status, _, _ = http_post(f"{http_server.http_url}/v1/generate", {"prompt": "hi", "max_tokens": 1})
        took.append((time.perf_counter() - t0) * 1e3)
        assert status == 200
    assert statistics.median(took) < 30.0, took


@pytest.mark.parametrize("path", ["/v1/generate", "/v1/completions"])
def test_stream_end_goes_out_with_its_last_event(http_server: Server, path: str) -> None:
    """The chunked body's terminator leaves in the same write as the ``[DONE]``: after that event the
    route books the request (metrics, its span), and an end written apart left that much after the
    server's last timestamp (0.5-0.7 ms at c=1 here, ms on a busy machine), in the next hop's or the
    client's link. A read that returns the ``[DONE]`` therefore returns the end too."""
    import socket

    body = json.dumps({"prompt": "hi", "max_tokens": 4, "stream": True, "model": "synthetic"}).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    request = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", http_server.http_port), timeout=10) as sock:
            sock.sendall(request)
            got = b""
            while b"data: [DONE]" not in got:
                data = sock.recv(1 << 20)
                assert data, got[-300:]
                got += data
            assert data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"), data[-80:]
