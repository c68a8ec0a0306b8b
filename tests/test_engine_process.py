"""``pathprobe serve --engine-process``: the engine in a child process answers like the engine
in the server's own process (same tokens, same errors, same timing entries), its timing is
measured where it runs, and a request is never lost silently when that process goes away.
(A full queue and a client that disconnects: ``tests/test_server.py``, both ways.)"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from tests.support.clients import grpc_generate, grpc_stream, http_post, sse_events
from tests.support.procs import Server
from tests.test_server import BAD_GRPC, _generate_together, assert_complete_split

TIMED = ("--engine", "synthetic", "--prefill-ms-per-token", "0.5", "--decode-ms-per-token", "5")


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _engine_pid(srv: Server) -> int:
    """The server's engine process (a spawned child that runs ``child_main``)."""
    for child in _children(srv.popen.pid):
        cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"multiprocessing" in cmd and b"resource_tracker" not in cmd:
            return child
    raise AssertionError(f"no engine process under {srv.popen.pid}: {_children(srv.popen.pid)}")


def _health(srv: Server) -> dict:
    return json.loads(urllib.request.urlopen(srv.http_url + "/healthz", timeout=5).read())


def _settled(srv: Server, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        health = _health(srv)
        if (health["running"] == 0 and health["queue_depth"] == 0) or time.monotonic() > deadline:
            return health
        time.sleep(0.05)


@pytest.fixture(scope="module")
def timed_pair(tmp_path_factory):
    """The same synthetic engine twice: in the server's process and in a process of its own."""
    tmp = tmp_path_factory.mktemp("engine-process")
    args = (*TIMED, "--max-batch-size", "2", "--max-queue", "64")
    inline = Server(tmp, *args)
    apart = Server(tmp, *args, "--engine-process")
    yield inline, apart
    inline.stop()
    apart.stop()


def test_the_engine_runs_in_a_child_process(timed_pair) -> None:
    inline, apart = timed_pair
    assert _engine_pid(apart) != apart.popen.pid
    with pytest.raises(AssertionError):
        _engine_pid(inline)


def test_same_answers_and_entries_as_the_engine_in_process(timed_pair) -> None:
    inline, apart = timed_pair
    for srv in timed_pair:
        grpc_generate(srv.grpc_target, prompt="warm", max_tokens=2)
    a, ea = grpc_generate(inline.grpc_target, prompt="The capital of France is", max_tokens=8, request_id="r1")
    b, eb = grpc_generate(apart.grpc_target, prompt="The capital of France is", max_tokens=8, request_id="r1")
    assert (a.text, list(a.token_ids), a.finish_reason) == (b.text, list(b.token_ids), b.finish_reason)
    assert a.usage == b.usage
    assert b.request_id == "r1"
    assert set(ea) == set(eb)
    assert_complete_split(eb)
    ca, _ = grpc_stream(inline.grpc_target, prompt="hello", max_tokens=6, stop=["zz"])
    cb, es = grpc_stream(apart.grpc_target, prompt="hello", max_tokens=6, stop=["zz"])
    assert [(c.text, list(c.token_ids), c.index, c.finish_reason) for c in ca] == [
        (c.text, list(c.token_ids), c.index, c.finish_reason) for c in cb
    ]
    assert cb[-1].usage.completion_tokens == 6
    assert_complete_split(es)
    status, _, body = http_post(apart.http_url + "/v1/generate", {"prompt": "hello", "max_tokens": 4, "stream": True})
    events = sse_events(body)
    assert status == 200 and events[-1] == "[DONE]" and len(events) >= 5


def test_engine_times_are_measured_in_the_engine_process(timed_pair) -> None:
    _, apart = timed_pair
    prompt_ids = list(range(10, 50))  # 40 tokens -> 20 ms prefill
    runs = [grpc_generate(apart.grpc_target, prompt_token_ids=prompt_ids, max_tokens=21)[1] for _ in range(5)]
    assert statistics.median(e["srv.prefill"] for e in runs) == pytest.approx(40 * 0.5, rel=0.10)
    assert statistics.median(e["srv.decode_steps"] for e in runs) == pytest.approx(20 * 5, rel=0.10)
    assert all(e["srv.queue"] < 2.0 for e in runs)
    # tokenizing stays in the server's process, before anything crosses to the engine
    text = [grpc_generate(apart.grpc_target, prompt="word " * 300, max_tokens=1)[1] for _ in range(3)]
    assert statistics.median(e["srv.tokenize"] for e in text) > 0.0


def test_queue_grows_only_beyond_the_engine_slots(timed_pair) -> None:
    _, apart = timed_pair
    within = _generate_together(apart.grpc_target, 2)
    assert max(e["srv.queue"] for e in within) < 5.0
    beyond = sorted(e["srv.queue"] for e in _generate_together(apart.grpc_target, 6))
    assert beyond[2] > 25.0 and beyond[-1] > 60.0, beyond


@pytest.mark.parametrize(("fields", "field"), BAD_GRPC)
def test_bad_input_fails_before_the_engine_process(timed_pair, fields: dict, field: str) -> None:
    _, apart = timed_pair
    with pytest.raises(grpc.RpcError) as info:
        grpc_generate(apart.grpc_target, **fields)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(field), info.value.details()


def test_deadline_and_disconnect_free_the_engine_slot(timed_pair) -> None:
    _, apart = timed_pair
    with pytest.raises(grpc.RpcError) as info:
        grpc_generate(apart.grpc_target, prompt="hi", max_tokens=200, timeout=0.1)  # ~1 s of decoding
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    from pathprobe.v1 import llm_pb2, llm_pb2_grpc

    with grpc.insecure_channel(apart.grpc_target) as ch:
        call = llm_pb2_grpc.LLMStub(ch).GenerateStream(llm_pb2.GenerateRequest(prompt="hi", max_tokens=500))
        next(call)
        call.cancel()
    health = _settled(apart)
    assert health["running"] == 0 and health["queue_depth"] == 0, health
    assert grpc_generate(apart.grpc_target, prompt="hi", max_tokens=2)[1]["srv.queue"] < 5.0


def test_an_engine_process_that_dies_fails_its_requests_loudly(tmp_path) -> None:
    srv = Server(tmp_path, "--engine", "synthetic", "--decode-ms-per-token", "20", "--engine-process")
    try:
        from pathprobe.v1 import llm_pb2, llm_pb2_grpc

        with grpc.insecure_channel(srv.grpc_target) as ch:
            call = llm_pb2_grpc.LLMStub(ch).GenerateStream(llm_pb2.GenerateRequest(prompt="hi", max_tokens=200))
            next(call)
            os.kill(_engine_pid(srv), signal.SIGKILL)
            with pytest.raises(grpc.RpcError) as info:
                list(call)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "engine process exited" in info.value.details()
        with pytest.raises(grpc.RpcError) as again:
            grpc_generate(srv.grpc_target, prompt="hi", max_tokens=2)
        assert again.value.code() == grpc.StatusCode.UNAVAILABLE
        assert srv.popen.poll() is None  # the server itself keeps answering, and says it is out
        with pytest.raises(urllib.error.HTTPError) as ei:
            _health(srv)
        assert ei.value.code == 503 and json.loads(ei.value.read())["status"] == "engine down"
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        with grpc.insecure_channel(srv.grpc_target) as ch:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2)
        assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        srv.stop()


def test_the_tiny_model_gives_the_same_tokens_in_its_own_process(tmp_path) -> None:
    inline = Server(tmp_path, "--engine", "transformers", "--model", "tiny", "--device", "cpu")
    apart = Server(tmp_path, "--engine", "transformers", "--model", "tiny", "--device", "cpu", "--engine-process")
    try:
        a, _ = grpc_stream(inline.grpc_target, prompt="The capital of France is", max_tokens=12)
        b, eb = grpc_stream(apart.grpc_target, prompt="The capital of France is", max_tokens=12)
        assert [list(c.token_ids) for c in a] == [list(c.token_ids) for c in b]
        assert "".join(c.text for c in a) == "".join(c.text for c in b)
        assert eb["srv.prefill"] > 0 and eb["srv.decode_steps"] > 0
        assert_complete_split(eb)
    finally:
        inline.stop()
        apart.stop()


# The front end falls behind (its loop busy for a second) while eight long streams run, so the engine
# process fills the pipe with their tokens; then a 131072-token prompt (~400 KB pickled, past the
# socket's buffers) goes the other way. Both sides once sent with a blocking write on their event
# loop: each waited for the other to read, for ever (a compare run at c=8, 32768-token prompts and
# 512-token streams hung the server for good).
_PIPE_BOTH_WAYS = textwrap.dedent(
    """
    import asyncio
    import time

    from pathprobe.server.engine.base import EngineConfig, GenParams
    from pathprobe.server.engine.process import ProcessEngine

    STREAMS, TOKENS, PROMPT = 8, 2000, 131072


    async def tokens(gen):
        return sum([len(ev.token_ids) async for ev in gen])


    async def main():
        eng = ProcessEngine(EngineConfig(kind="synthetic", max_batch_size=16, max_context=PROMPT + 64,
                                         prefill_ms_per_token=0.0, decode_ms_per_token=0.0))
        await eng.start()
        try:
            gens = [eng.generate(GenParams(prompt="hi", max_tokens=TOKENS, ignore_eos=True)) for _ in range(STREAMS)]
            await asyncio.sleep(0.05)  # they run
            time.sleep(1.0)  # the front end's loop is busy: nobody reads the pipe
            big = eng.generate(GenParams(prompt_token_ids=[256 + i % 1000 for i in range(PROMPT)], max_tokens=4))
            counts = await asyncio.wait_for(asyncio.gather(*(tokens(g) for g in [*gens, big])), 60)
        finally:
            await eng.stop()
        print(*counts)


    asyncio.run(main())
    """
)


def test_a_big_prompt_meets_a_full_pipe_of_tokens_without_a_deadlock(tmp_path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", _PIPE_BOTH_WAYS], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    counts = [int(n) for n in run.stdout.split()]
    assert counts == [2000] * 8 + [4], counts
