"""The default engine (transformers on the tiny model) behind every front end."""

from __future__ import annotations

import json

import pytest
from pathprobe import timing

from tests.support.clients import grpc_generate, grpc_stream, http_post, sse_events
from tests.test_server import assert_complete_split

pytestmark = pytest.mark.slow


def test_tiny_all_front_ends_agree(tiny_server) -> None:
    fields = {"prompt": "The capital of France is", "max_tokens": 8, "ignore_eos": True}
    resp, entries = grpc_generate(tiny_server.grpc_target, **fields)
    assert resp.usage.completion_tokens == 8 and resp.model == "tiny"
    assert_complete_split(entries)
    assert entries["srv.prefill"] > 0 and entries["srv.decode_steps"] > 0

    chunks, entries = grpc_stream(tiny_server.grpc_target, **fields)
    assert "".join(c.text for c in chunks) == resp.text  # greedy: same text on every path
    assert_complete_split(entries)

    status, headers, body = http_post(f"{tiny_server.http_url}/v1/generate", fields)
    assert status == 200 and json.loads(body)["text"] == resp.text
    assert_complete_split(timing.parse(headers["Server-Timing"]))

    status, _, body = http_post(f"{tiny_server.http_url}/v1/generate", {**fields, "stream": True})
    events = sse_events(body)
    assert "".join(e["text"] for e in events[:-1]) == resp.text
    assert_complete_split(timing.parse(events[-2]["server_timing"]))


def test_tiny_openai_client(tiny_server) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{tiny_server.http_url}/v1", api_key="none")
    c = client.completions.create(
        model="tiny", prompt="The capital of France is", max_tokens=6, temperature=0, extra_body={"ignore_eos": True}
    )
    assert c.usage.completion_tokens == 6
    chat = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5, temperature=0
    )
    assert_complete_split(timing.parse(chat.headers["server-timing"]))
    parts = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5, temperature=0, stream=True
        )
    )
    assert "".join(p.choices[0].delta.content or "" for p in parts) == chat.parse().choices[0].message.content
    assert_complete_split(timing.parse(parts[-1].model_extra["server_timing"]))
