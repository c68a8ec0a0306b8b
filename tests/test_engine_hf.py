"""The transformers engine on the real tiny model (no mocks): streaming, batching, stops, timing."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from pathprobe import models
from pathprobe.errors import InvalidArgument, ResourceExhausted
from pathprobe.server.engine.base import EngineConfig, Generation, GenParams
from pathprobe.server.engine.hf import IncrementalDetokenizer, TransformersEngine, holdback, stop_index
from pathprobe.timing import now_ms

PROMPTS = [
    "The capital of France is",
    "Hello! How are you",
    "def add(a, b):",
    "Once upon a time there was",
    "Water boils at",
    "The weather today is cloudy",
]


def run(coro):
    return asyncio.run(coro)


def make_engine(**kw) -> TransformersEngine:
    eng = TransformersEngine(EngineConfig(**kw))
    run(eng.start())
    return eng


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    """4 slots, small batching window. Requests carry their own event loop, so one
    engine serves every test's asyncio.run()."""
    eng = make_engine(max_batch_size=4, max_wait_ms=2.0, max_queue=16)
    yield eng
    run(eng.stop())


async def timed_events(gen: Generation) -> list[tuple[float, object]]:
    out = []
    async for ev in gen:
        out.append((now_ms(), ev))
    return out


def greedy(engine: TransformersEngine, prompt: str, n: int = 24, **kw) -> tuple[str, list[int], Generation]:
    async def go():
        g = engine.generate(GenParams(prompt=prompt, max_tokens=n, **kw))
        text, ids = await g.collect()
        return text, ids, g

    return run(go())


def wait_idle(engine: TransformersEngine, timeout: float = 10.0) -> None:
    async def go():
        deadline = now_ms() + timeout * 1000
        while engine.running() or engine.queue_depth():
            assert now_ms() < deadline, (engine.running(), engine.queue_depth())
            await asyncio.sleep(0.01)

    run(go())


def test_model_name_and_context(engine: TransformersEngine) -> None:
    assert engine.model_name == "tiny"
    assert engine.max_context == 1024
    assert engine.device == "cpu"


def test_tokens_stream_one_by_one(engine: TransformersEngine) -> None:
    # 48 tokens: the tiny model's ~0.5 ms steps run in the engine's thread, and the consumer's loop
    # gets the GIL back at most every switch interval (5 ms), so with a dozen tokens (~6 ms) every
    # event could arrive in one burst even when each was delivered as it was made
    n = 48

    async def go():
        t0 = now_ms()
        g = engine.generate(GenParams(prompt=PROMPTS[0], max_tokens=n, ignore_eos=True))
        evs = await timed_events(g)
        return t0, g, evs

    t0, g, evs = run(go())
    assert len(evs) == n
    assert all(len(ev.token_ids) == 1 for _, ev in evs)
    assert [ev.finish_reason for _, ev in evs] == [None] * (n - 1) + ["length"]
    times = [t for t, _ in evs]
    assert times == sorted(times)
    # each token reached the consumer as soon as it was made, not all at the end
    assert times[-1] - times[0] > 0.5 * (g.timing.decode_steps * (n - 2) / (n - 1))
    assert g.completion_tokens == n and g.prompt_tokens == 6


def test_greedy_is_deterministic(engine: TransformersEngine) -> None:
    a = greedy(engine, PROMPTS[1], ignore_eos=True)
    b = greedy(engine, PROMPTS[1], ignore_eos=True)
    assert a[0] == b[0] and a[1] == b[1] and len(a[1]) == 24
    # text equals a plain decode of the ids (incremental detokenization loses nothing)
    assert a[0] == engine.tokenizer.decode(a[1], skip_special_tokens=True)


def test_batch_matches_each_alone(engine: TransformersEngine) -> None:
    alone = [greedy(engine, p, 20, ignore_eos=True)[:2] for p in PROMPTS]

    async def together():
        gens = [engine.generate(GenParams(prompt=p, max_tokens=20, ignore_eos=True)) for p in PROMPTS]
        res = await asyncio.gather(*(g.collect() for g in gens))
        return res, gens

    res, gens = run(together())
    assert res == alone
    assert max(g.timing.batch_size for g in gens) == 4  # really ran batched (4 slots)


def test_staggered_arrivals_join_running_batch(engine: TransformersEngine) -> None:
    """Continuous batching: a request that arrives mid-generation joins without waiting.

    The first request decodes 192 tokens and the late ones are sent after its 5th: the consumer's
    loop may get its tokens in bursts (the GIL's 5 ms switch interval on a busy box), so a short
    first request could be over before the late ones exist; this one is still decoding then."""
    n_first = 192
    alone = [greedy(engine, PROMPTS[0], n_first, ignore_eos=True)[:2]]
    alone += [greedy(engine, p, 16, ignore_eos=True)[:2] for p in PROMPTS[1:3]]

    async def go():
        first = engine.generate(GenParams(prompt=PROMPTS[0], max_tokens=n_first, ignore_eos=True))
        it = first.__aiter__()
        head = [await it.__anext__() for _ in range(5)]
        late = [engine.generate(GenParams(prompt=p, max_tokens=16, ignore_eos=True)) for p in PROMPTS[1:3]]
        rest = [ev async for ev in it]
        first_text = "".join(e.text for e in head + rest)
        late_res = await asyncio.gather(*(g.collect() for g in late))
        return first, first_text, late, late_res

    first, first_text, late, late_res = run(go())
    assert first.completion_tokens == n_first
    assert first_text == alone[0][0]
    assert late_res == alone[1:]
    assert first.timing.batch_size == 3  # the late ones joined its batch
    for g in late:
        assert g.timing.batch_size == 3


def test_sampling_seed_and_top_p(engine: TransformersEngine) -> None:
    g = greedy(engine, PROMPTS[2], ignore_eos=True)[1]
    s1 = greedy(engine, PROMPTS[2], temperature=1.0, seed=7, ignore_eos=True)[1]
    s2 = greedy(engine, PROMPTS[2], temperature=1.0, seed=7, ignore_eos=True)[1]
    s3 = greedy(engine, PROMPTS[2], temperature=1.5, seed=8, ignore_eos=True)[1]
    assert s1 == s2  # same seed, same tokens
    assert s1 != s3
    # a nucleus so small it keeps only the top token is greedy decoding
    assert greedy(engine, PROMPTS[2], temperature=1.0, top_p=1e-6, seed=3, ignore_eos=True)[1] == g


def test_stop_strings(engine: TransformersEngine) -> None:
    full, ids, _ = greedy(engine, PROMPTS[3], 30, ignore_eos=True)
    words = full.split()
    stop = next(w for w in words[3:] if len(w) >= 3 and full.index(w) > 5)
    cut = full.index(stop)

    async def go():
        g = engine.generate(GenParams(prompt=PROMPTS[3], max_tokens=30, ignore_eos=True, stop=["zzzz-never", stop]))
        return g, [ev async for ev in g]

    g, evs = run(go())
    text = "".join(e.text for e in evs)
    assert text == full[:cut]
    assert stop not in text
    assert g.finish_reason == "stop" and evs[-1].finish_reason == "stop"
    assert len(evs) < 30


def test_ignore_eos_and_length(tmp_path: Path) -> None:
    """A local model folder whose generation_config names an extra EOS id the greedy output hits."""
    folder = tmp_path / "eosy"
    shutil.copytree(models.ensure_tiny(), folder)
    base = make_engine(model=str(folder), max_batch_size=2)
    try:
        _, ids, _ = greedy(base, PROMPTS[0], 12, ignore_eos=True)
    finally:
        run(base.stop())
    eos_at = 3
    gc = json.loads((folder / "generation_config.json").read_text())
    gc["eos_token_id"] = [*gc["eos_token_id"], ids[eos_at]]
    (folder / "generation_config.json").write_text(json.dumps(gc))
    eng = make_engine(model=str(folder), max_batch_size=2)
    try:
        assert eng.model_name == "eosy"
        _, ids2, g = greedy(eng, PROMPTS[0], 12)
        first = ids.index(ids[eos_at])  # the EOS id may already occur earlier
        assert ids2 == ids[: first + 1] and g.finish_reason == "stop"
        _, ids3, g3 = greedy(eng, PROMPTS[0], 12, ignore_eos=True)
        assert ids3 == ids and g3.finish_reason == "length" and g3.completion_tokens == 12
    finally:
        run(eng.stop())


def test_context_and_token_id_checks(engine: TransformersEngine) -> None:
    async def go():
        with pytest.raises(InvalidArgument) as exc:
            engine.generate(GenParams(prompt_token_ids=[5] * 1000, max_tokens=100))
        assert exc.value.field == "prompt" and "1024" in exc.value.message
        with pytest.raises(InvalidArgument) as exc:
            engine.generate(GenParams(prompt_token_ids=[5, 99999], max_tokens=4))
        assert exc.value.field == "prompt_token_ids[1]"
        with pytest.raises(InvalidArgument) as exc:
            engine.generate(GenParams(prompt="x", model="other"))
        assert exc.value.field == "model"
        # exactly at the limit is fine, and token ids are accepted as a prompt
        g = engine.generate(GenParams(prompt_token_ids=[5] * 1020, max_tokens=4, ignore_eos=True))
        text, ids = await g.collect()
        assert len(ids) == 4 and g.prompt_tokens == 1020

    run(go())


def test_queue_full_and_cancel_frees_slots() -> None:
    eng = make_engine(max_batch_size=1, max_queue=2, max_wait_ms=0.0)
    try:

        async def go():
            a = eng.generate(GenParams(prompt=PROMPTS[0], max_tokens=400, ignore_eos=True))
            ita = a.__aiter__()
            await ita.__anext__()  # a holds the only slot
            assert eng.running() == 1
            b = eng.generate(GenParams(prompt=PROMPTS[1], max_tokens=400, ignore_eos=True))
            c = eng.generate(GenParams(prompt=PROMPTS[2], max_tokens=3, ignore_eos=True))
            assert eng.queue_depth() == 2
            with pytest.raises(ResourceExhausted, match="queue is full"):
                eng.generate(GenParams(prompt=PROMPTS[3], max_tokens=3))
            # b's client goes away while b is still queued
            tb = asyncio.ensure_future(b.collect())
            await asyncio.sleep(0.01)
            tb.cancel()
            with pytest.raises(asyncio.CancelledError):
                await tb
            # a's client goes away mid-stream
            await ita.__anext__()
            await ita.aclose()
            assert a.cancelled
            t_close = now_ms()
            text, ids = await c.collect()  # c gets the slot without waiting for a's 400 tokens
            assert len(ids) == 3 and c.finish_reason == "length"
            return t_close, a, b, c

        t_close, a, b, c = run(go())
        wait_idle(eng)
        assert eng.running() == 0 and eng.queue_depth() == 0
        assert eng.stats["cancelled"] == 2
        # a stopped computing right away: far fewer than its 400 tokens were made
        assert a.completion_tokens < 50 and eng.stats["tokens"] < 60
        assert b.completion_tokens == 0
        # the engine still serves, in a free slot
        text, ids, g = greedy(eng, PROMPTS[4], 4, ignore_eos=True)
        assert len(ids) == 4 and g.timing.batch_size == 1
    finally:
        run(eng.stop())


def test_timing_parts_within_wall_time(engine: TransformersEngine) -> None:
    async def go():
        t0 = now_ms()
        gens = [engine.generate(GenParams(prompt=p, max_tokens=10, ignore_eos=True)) for p in PROMPTS[:3]]
        await asyncio.gather(*(g.collect() for g in gens))
        return now_ms() - t0, gens

    wall, gens = run(go())
    for g in gens:
        t = g.timing
        for name in ("tokenize", "prefill", "decode_steps", "detokenize"):
            assert getattr(t, name) > 0, name
        assert t.queue >= 0
        parts = t.tokenize + t.queue + t.prefill + t.decode_steps + t.detokenize
        assert parts <= wall + 0.01
        assert t.tokenize_start <= t.queue_start <= t.prefill_start < t.decode_start
        assert t.prefill_start + t.prefill <= t.decode_start + 0.001
        assert t.first_token_at >= t.decode_start
        assert t.batch_size == 3


def test_queue_grows_only_beyond_batch_size() -> None:
    eng = make_engine(max_batch_size=2, max_wait_ms=1.0)
    try:

        async def burst(n: int) -> list[Generation]:
            gens = [eng.generate(GenParams(prompt=PROMPTS[i], max_tokens=24, ignore_eos=True)) for i in range(n)]
            await asyncio.gather(*(g.collect() for g in gens))
            return gens

        under = run(burst(2))
        over = run(burst(4))
        q_under = [g.timing.queue for g in under]
        q_over = sorted(g.timing.queue for g in over)
        gen_time = min(g.timing.prefill + g.timing.decode_steps for g in over[:2])
        # the two that found no slot waited about one whole generation of the others
        assert q_over[2] > 0.5 * gen_time and q_over[3] > 0.5 * gen_time
        # no waiting beyond the batching window and step boundaries when slots are free
        assert max(q_under) < 0.25 * min(q_over[2:])
        assert max(g.timing.batch_size for g in over) == 2
    finally:
        run(eng.stop())


def test_weightless_folder_builds_from_config(tmp_path: Path) -> None:
    """A preset-like folder (config + tokenizer, no weights) loads with random weights."""
    folder = tmp_path / "arch-only"
    shutil.copytree(models.ensure_tiny(), folder)
    (folder / "model.safetensors").unlink()
    eng = make_engine(model=str(folder), dtype="bfloat16", max_batch_size=2)
    try:
        import torch

        assert eng.model.dtype == torch.bfloat16
        text, ids, g = greedy(eng, PROMPTS[0], 5, ignore_eos=True)
        assert len(ids) == 5 and g.finish_reason == "length"
    finally:
        run(eng.stop())


def test_detokenizer_and_stop_helpers(engine: TransformersEngine) -> None:
    tok = engine.tokenizer
    ids = tok.encode("Hello wörld ✓ ok", add_special_tokens=False)
    d = IncrementalDetokenizer(lambda x: tok.decode(x, skip_special_tokens=True))
    pieces = [d.add(i) for i in ids] + [d.flush()]
    assert "".join(pieces) == "Hello wörld ✓ ok"
    assert all("\ufffd" not in p for p in pieces)
    assert stop_index("abc STOP def", ["STOP"], 0) == 4
    assert stop_index("abc STOP def", ["STOP"], 9) is None
    assert holdback("the end of ST", ["STOP"]) == 2
    assert holdback("nothing", ["STOP"]) == 0


@pytest.mark.parametrize("prefill", ["batched", "static"])
def test_static_cache_path_matches_dynamic(engine: TransformersEngine, prefill: str) -> None:
    """static_cache=1 (the CUDA-graph decode path, run eagerly here): same tokens, slots freed.
    ``static``: newcomers prefill one at a time into bucket-sized static buffers (the path
    CUDA graphs replay for prefill), KV copied into their slots."""
    extra = {"prefill_max_len": "128"} if prefill == "static" else {}
    eng = make_engine(
        max_batch_size=4, max_wait_ms=2.0, options={"static_cache": "1", "static_max_len": "256", **extra}
    )
    try:
        assert eng.max_context == 256 and eng._static is not None
        assert eng._static.p_buckets == ([16, 32, 64, 128] if prefill == "static" else [])
        prompts = [*PROMPTS, PROMPTS[1] * 12]  # ~60 tokens: its decode crosses the 64-column width bucket
        alone = [greedy(engine, p, 16, ignore_eos=True)[:2] for p in prompts]

        async def go():
            gens = [eng.generate(GenParams(prompt=p, max_tokens=16, ignore_eos=True)) for p in prompts]
            together = await asyncio.gather(*(g.collect() for g in gens))
            # staggered: a longer prompt joins a running batch (its columns are moved to make room)
            first = eng.generate(GenParams(prompt=prompts[0], max_tokens=16, ignore_eos=True))
            it = first.__aiter__()
            head = [await it.__anext__() for _ in range(3)]
            late = eng.generate(GenParams(prompt=prompts[-1], max_tokens=16, ignore_eos=True))
            rest = [ev async for ev in it]
            late_res = await late.collect()
            # a client leaves mid-stream: its slot comes back
            c = eng.generate(GenParams(prompt=prompts[2], max_tokens=200, ignore_eos=True))
            itc = c.__aiter__()
            await itc.__anext__()
            await itc.aclose()
            return together, "".join(e.text for e in head + rest), late_res, first, late

        together, first_text, late_res, first, late = run(go())
        assert together == alone
        assert first_text == alone[0][0] and late_res == alone[-1]
        assert first.timing.batch_size == 2 and late.timing.batch_size == 2
        with pytest.raises(InvalidArgument, match="256"):
            eng.generate(GenParams(prompt_token_ids=[5] * 250, max_tokens=10))
        wait_idle(eng)
        assert sorted(eng._static.free) == [0, 1, 2, 3] and not eng._static.start
        assert (eng.stats["static_prefills"] > 0) == (prefill == "static")
    finally:
        run(eng.stop())
