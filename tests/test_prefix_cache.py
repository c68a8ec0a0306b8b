"""Prefix caching in the transformers engine, on the real tiny model (no mocks): a prompt that starts
with a cached prefix prefills only its new tokens, greedy output is the uncached path's, the count is
reported on every front end, and the cache stays within its bounds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import grpc
import pytest
from pathprobe import timing
from pathprobe.errors import ConfigError
from pathprobe.server.engine.base import EngineConfig, EngineTiming, GenParams
from pathprobe.server.engine.hf import TransformersEngine
from pathprobe.server.engine.prefix import MIN_MATCH_TOKENS, PrefixCache, PrefixCacheOptions
from pathprobe.server.engine.process import _apply, _timing
from pathprobe.v1 import llm_pb2, llm_pb2_grpc

from tests.support.clients import http_post, sse_events
from tests.support.procs import Server

SYSTEM = "You are a careful assistant. Answer in one short sentence and never make anything up. " * 2
TURNS = [SYSTEM + "What is the capital of France?", SYSTEM + "Name a prime number.", SYSTEM + "Say hi."]


def run(coro):
    return asyncio.run(coro)


def make(**options: str) -> TransformersEngine:
    eng = TransformersEngine(EngineConfig(max_batch_size=4, max_wait_ms=5.0, options=dict(options)))
    run(eng.start())
    return eng


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    eng = make()
    yield eng
    run(eng.stop())


def uncached(eng: TransformersEngine, prompts: list[str], n: int = 10) -> list[list[int]]:
    """Greedy tokens of ``prompts`` on the same engine with its prefix cache set aside (idle engine)."""
    pc, eng.prefix_cache = eng.prefix_cache, None
    try:
        return [ids for ids, n_cached, _ in run(_gen(eng, prompts, n)) if n_cached == 0]
    finally:
        eng.prefix_cache = pc


async def _gen(eng: TransformersEngine, prompts: list[str], n: int = 10) -> list[tuple[list[int], int, int]]:
    gens = [eng.generate(GenParams(prompt=p, max_tokens=n, ignore_eos=True)) for p in prompts]
    out = []
    for g in gens:
        _, ids = await g.collect()
        out.append((ids, g.timing.cached_tokens, g.prompt_tokens))
    while eng.running():  # the last token reaches us before the worker files the finished rows away
        await asyncio.sleep(0.001)
    return out


def test_second_request_prefills_only_the_suffix(engine: TransformersEngine) -> None:
    cached = engine
    assert cached.prefix_cache is not None
    (first,) = run(_gen(cached, [TURNS[0]]))
    assert first[1] == 0  # nothing cached yet
    before = cached.stats["prefill_tokens"]
    (second,) = run(_gen(cached, [TURNS[1]]))
    ids, n_cached, n_prompt = second
    shared = len(cached.encode_prompt(SYSTEM.rstrip()))  # the system prompt's tokens, give or take the joint
    assert n_cached >= min(shared - 2, MIN_MATCH_TOKENS) and n_cached < n_prompt
    assert cached.stats["prefill_tokens"] - before == n_prompt - n_cached  # the model computed the suffix only
    # greedy: the same tokens as the engine without a prefix cache
    assert [ids] == uncached(cached, [TURNS[1]])
    # a turn that extends a finished one (prompt + its answer + more) reuses the prompt and the answer
    follow = cached.tokenizer.decode(cached.encode_prompt(TURNS[0]) + first[0], skip_special_tokens=True) + " Why?"
    (third,) = run(_gen(cached, [follow]))
    assert third[1] > n_cached and [third[0]] == uncached(cached, [follow])


def test_hits_and_misses_batched_together_match_uncached(engine: TransformersEngine) -> None:
    prompts = [TURNS[2], "A prompt that shares nothing", SYSTEM + "Count to three.", TURNS[0]]
    got = run(_gen(engine, prompts))
    assert [g[0] for g in got] == uncached(engine, prompts)
    assert got[1][1] == 0 and all(g[1] > 0 for i, g in enumerate(got) if i != 1)


def test_hits_of_different_lengths_prefill_in_one_forward(engine: TransformersEngine) -> None:
    # three hits on the system prompt with 2 to ~12 new tokens: one forward as wide as the longest new
    # part; the shorter ones take less of their cached prefix and compute the rest again
    run(_gen(engine, [TURNS[0]]))  # the system prompt is cached
    prompts = [SYSTEM + "Hi.", SYSTEM + "Tell me about rivers, lakes, the sea and the rain.", SYSTEM + "Two colors?"]
    forwards, before = engine.stats["prefills"], engine.stats["prefill_tokens"]
    got = run(_gen(engine, prompts))
    computed, rounds = engine.stats["prefill_tokens"] - before, engine.stats["prefills"] - forwards
    assert [g[0] for g in got] == uncached(engine, prompts)  # greedy: the uncached path's tokens
    n = [g[2] for g in got]
    cached = [g[1] for g in got]
    assert all(c > 0 for c in cached)
    assert computed == sum(x - c for x, c in zip(n, cached, strict=True))
    assert rounds == 1  # the three arrived within one batching window
    m = n[1] - cached[1]  # the longest new part: all of it computed
    assert cached[0] == n[0] - m and cached[2] == n[2] - m  # the others: their last m tokens computed


def test_eviction_keeps_the_cache_bounded(engine: TransformersEngine) -> None:
    prompts = [f"Story number {i}: " + SYSTEM[: 80 + 9 * i] for i in range(5)]
    kept = engine.prefix_cache
    try:
        engine.prefix_cache = pc = PrefixCache(64 * 2**20, 2)  # by entries
        run(_gen(engine, prompts, n=4))
        assert len(pc) == 2 and pc.stats["stored"] == 5 and pc.stats["evicted"] == 3
        engine.prefix_cache = pc = PrefixCache(pc.bytes * 3 // 4, 64)  # by bytes: about one entry's room
        run(_gen(engine, prompts, n=4))
        assert 1 <= len(pc) < 3 and pc.bytes <= pc.max_bytes and pc.stats["evicted"] >= 2
    finally:
        engine.prefix_cache = kept
    with pytest.raises(ConfigError):
        PrefixCacheOptions.parse(True, "0", 64)


def test_the_engine_process_pipe_carries_the_count() -> None:
    t = EngineTiming(cached_tokens=48, batch_size=3)
    back = EngineTiming()
    _apply(back, _timing(t))
    assert (back.cached_tokens, back.batch_size) == (48, 3)


@pytest.mark.slow
def test_cached_count_on_every_front_end(tiny_server: Server) -> None:
    """The session's tiny-model server (prefix cache on by default); these prompts are this file's own."""
    server = tiny_server
    fields = {"prompt": TURNS[0], "max_tokens": 4, "ignore_eos": True}
    with grpc.insecure_channel(server.grpc_target) as ch:
        stub = llm_pb2_grpc.LLMStub(ch)
        first, call = stub.Generate.with_call(llm_pb2.GenerateRequest(**fields))
        assert first.usage.cached_tokens == 0
        assert timing.CACHED_TOKENS_KEY not in dict(call.trailing_metadata())
        resp, call = stub.Generate.with_call(llm_pb2.GenerateRequest(**fields))
        n = resp.usage.cached_tokens
        assert 0 < n < resp.usage.prompt_tokens and resp.token_ids == first.token_ids
        assert dict(call.trailing_metadata())[timing.CACHED_TOKENS_KEY] == str(n)
        stream = stub.GenerateStream(llm_pb2.GenerateRequest(**fields))
        chunks = list(stream)
        assert chunks[-1].usage.cached_tokens == n
        assert dict(stream.trailing_metadata())[timing.CACHED_TOKENS_KEY] == str(n)

    url = server.http_url
    status, headers, body = http_post(f"{url}/v1/generate", fields)
    assert status == 200 and json.loads(body)["usage"]["cached_tokens"] == n
    assert headers[timing.CACHED_TOKENS_KEY] == str(n)
    _, _, body = http_post(f"{url}/v1/generate", {**fields, "stream": True})
    assert sse_events(body)[-2]["usage"]["cached_tokens"] == n

    comp = {"model": "tiny", "prompt": TURNS[0], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    status, headers, body = http_post(f"{url}/v1/completions", comp)
    assert json.loads(body)["usage"]["prompt_tokens_details"] == {"cached_tokens": n}
    assert headers[timing.CACHED_TOKENS_KEY] == str(n)
    stream_opts = {"stream": True, "stream_options": {"include_usage": True}}
    _, _, body = http_post(f"{url}/v1/completions", {**comp, **stream_opts})
    assert sse_events(body)[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": n}

    chat = {
        "model": "tiny",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say hi."}],
        "max_tokens": 4,
        "temperature": 0,
    }
    _, _, body = http_post(f"{url}/v1/chat/completions", chat)
    assert json.loads(body)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    status, headers, body = http_post(f"{url}/v1/chat/completions", chat)
    usage = json.loads(body)["usage"]
    m = usage["prompt_tokens_details"]["cached_tokens"]
    assert status == 200 and 0 < m < usage["prompt_tokens"] and headers[timing.CACHED_TOKENS_KEY] == str(m)
    _, _, body = http_post(f"{url}/v1/chat/completions", {**chat, **stream_opts})
    assert sse_events(body)[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": m}
