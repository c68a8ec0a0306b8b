"""Datasets and trace replay: ShareGPT JSON, JSONL with text or token counts, the Azure LLM
inference CSV and the Mooncake JSONL, read from the small files in tests/data/datasets/, replayed
open loop against a real server on loopback, in one process and with a master and two workers
(every scheduled request sent exactly once); bad input fails before the run, naming the file,
the line and the field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pathprobe.errors import ConfigError
from pathprobe.loadgen import datasets, prompts, traces
from pathprobe.loadgen.replay import Replay
from pathprobe.records import RequestRecord
from pydantic import TypeAdapter

from tests.support.procs import Proc, free_port

DATA = Path(__file__).resolve().parent / "data" / "datasets"
AZURE = DATA / "azure_llm.csv"
MOONCAKE = DATA / "mooncake.jsonl"
SHAREGPT = DATA / "sharegpt.json"
JSONL = DATA / "prompts_tokens.jsonl"
WORDS = prompts.load_tokenizer("none")


# --- reading ----------------------------------------------------------------------------------
def test_azure_trace_is_read_relative_to_its_first_row() -> None:
    e = traces.read(str(AZURE), "azure")
    assert len(e) == 12 and [x.index for x in e] == list(range(12))
    assert e[0].at_ms == 0.0 and e[1].at_ms == pytest.approx(70.643, abs=0.01)
    assert e[-1].at_ms == pytest.approx(1219.41, abs=0.01)
    assert (e[3].input_tokens, e[3].output_tokens) == (600, 2)
    assert traces.read(str(AZURE)) == e  # the format from the extension


def test_mooncake_trace_keeps_hash_ids_and_shared_ids_share_prompt_prefix_text() -> None:
    e = traces.read(str(MOONCAKE), "mooncake")
    assert len(e) == 11 and e[0].hash_ids == (0, 1) and e[2].at_ms == 120.0
    replay = Replay(e, datasets.load_corpus("", WORDS))
    got = [replay.take() for _ in e]
    assert replay.take() is None
    words = [s.prompt.text.split() for s in got if s is not None]
    assert [len(w) for w in words] == [x.input_tokens for x in e]  # the trace's lengths
    assert [s.prompt.max_tokens for s in got if s is not None] == [x.output_tokens for x in e]
    # 0 and 1 share hash id 0 (one 512-token block), then differ; 0 and 8 share [0, 1]
    assert words[0][:512] == words[1][:512] and words[0][512:] != words[1][512:600]
    assert words[8][:700] == words[0]
    assert words[2] != words[0][:300]  # hash id 3 vs 0: no accidental sharing


def test_tokenizer_cut_prompts_have_the_trace_lengths() -> None:
    tok = prompts.load_tokenizer("tiny")
    replay = Replay(traces.read(str(MOONCAKE)), datasets.load_corpus("", tok))
    for e in replay.mine:
        s = replay.take()
        assert s is not None and len(tok.encode(s.prompt.text)) == e.input_tokens


def test_replay_shares_split_the_trace_exactly_once_and_scale_time() -> None:
    e = traces.read(str(AZURE))
    corpus = datasets.load_corpus("", WORDS)
    taken: list[int] = []
    for rank in range(3):
        r = Replay(e, corpus, time_scale=0.5, rank=rank, of=3, start_ns=0)
        while (s := r.take()) is not None:
            taken.append(s.entry.index)
            assert s.intended_ns == int(s.entry.at_ms * 0.5 * 1e6)
            r.done_one()
        assert r.finished
    assert sorted(taken) == list(range(len(e)))


def test_sharegpt_and_jsonl_prompt_sets() -> None:
    sg = prompts.build("sharegpt", path=str(SHAREGPT), tokenizer="none").prompts
    # the one-turn conversation is skipped; max_tokens is the reply's length
    assert [p.text for p in sg][1] == "Name three birds that live in reed beds."
    assert [p.max_tokens for p in sg] == [14, 6, 14] and len(sg) == 3
    js = prompts.build("file", path=str(JSONL), tokenizer="none").prompts
    assert [(p.tokens, p.max_tokens) for p in js] == [(32, 2), (None, 3), (600, 1), (None, None), (8, None)]
    assert len(js[2].text.split()) == 600


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("t.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,10\n", r"t\.csv:1: missing column GeneratedTokens"),
        (
            "t.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,2\n2023-11-16 18:15:46.70,-3,2\n",
            r"t\.csv:3: ContextTokens: must be >= 0, got -3",
        ),
        (
            "t.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,2\nyesterday,10,2\n",
            r"t\.csv:3: TIMESTAMP: expected a time",
        ),
        (
            "t.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10\n",
            r"t\.csv:2: GeneratedTokens: missing",
        ),
        ("t.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{oops\n', r"t\.jsonl:2: malformed JSON"),
        ("t.jsonl", '{"timestamp": 0, "input_length": 5}\n', r"t\.jsonl:1: output_length: missing"),
        (
            "t.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 9, "input_length": -5, '
            '"output_length": 1}\n',
            r"t\.jsonl:2: input_length: must be >= 0, got -5",
        ),
        ("t.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}\n', r":1: hash_ids"),
    ],
)
def test_bad_trace_names_file_line_and_field(tmp_path: Path, name: str, text: str, match: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"^trace: .*" + match):
        traces.read(str(path))


@pytest.mark.parametrize(
    ("kind", "text", "match"),
    [
        (
            "sharegpt",
            '[\n  {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": 3}]}\n]',
            r":2: conversations\[1\]\.value",
        ),
        ("sharegpt", '[\n  {"conversations": []},\n  {"id": 1}\n]', r":3: conversations: missing"),
        ("sharegpt", '[\n  {"conversations": [}\n]', r":2: malformed JSON"),
        ("file", '{"input_tokens": 4}\n{"input_tokens": -4}\n', r":2: input_tokens: must be > 0, got -4"),
        ("file", '{"input_tokens": 4, "output_tokens": "x"}\n', r":1: output_tokens: expected a positive integer"),
        ("file", '{"max_tokens": 4}\n', r":1: prompt: missing"),
    ],
)
def test_bad_dataset_names_file_line_and_field(tmp_path: Path, kind: str, text: str, match: str) -> None:
    path = tmp_path / "d.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"^prompt-file: .*d\.json" + match):
        datasets.check_inputs("", "", kind, str(path))


def test_bad_trace_fails_before_locust_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,-1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pathprobe", "load", "--headless", "-H", "grpc://127.0.0.1:1", "--trace", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{bad}:2: GeneratedTokens: must be >= 0, got -1" in proc.stderr
    assert "Traceback" not in proc.stderr


# --- replay against a real server ---------------------------------------------------------------
#: (input flags, expected records: trace indexes or None for a prompt set, target kind)
CASES = {
    "azure": (["--trace", str(AZURE), "--trace-format", "azure", "--time-scale", "0.5"], "grpc"),
    "mooncake": (["--trace", str(MOONCAKE), "--trace-format", "mooncake", "--time-scale", "0.5"], "http"),
    "sharegpt": (["--prompt-set", "sharegpt", "--prompt-file", str(SHAREGPT), "--arrival", "constant"], "openai"),
    "jsonl": (["--prompt-set", "file", "--prompt-file", str(JSONL), "--arrival", "constant"], "grpc"),
}


def _host(server, kind: str) -> str:
    return {
        "grpc": f"grpc://{server.grpc_target}",
        "http": server.http_url,
        "openai": f"openai+{server.http_url}",
    }[kind]


def _load(out: Path, host: str, flags: list[str], distributed: bool) -> None:
    """One run: a single process, or a master and two workers; open loop, `--tokenizer none`."""
    common = ["--tokenizer", "none", "-L", "WARNING"]
    run = [*flags, "--rate", "12"] if "--arrival" in flags else flags
    run_time = "3s" if "--arrival" in flags else "20s"  # a trace ends the run when it is replayed
    args = ["--headless", "-H", host, "-u", "4", "-r", "50", "-t", run_time, "--out", str(out), "--only-summary", *run]
    base = [sys.executable, "-m", "pathprobe", "load"]
    if not distributed:
        proc = subprocess.run([*base, *args, *common], capture_output=True, text=True, timeout=120)
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        return
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    worker = [*base, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port), *common]
    workers = [Proc(worker, out.parent / f"worker{i}.log", env) for i in range(2)]
    try:
        master = [*base, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port)]
        proc = subprocess.run(
            [*master, "--expect-workers", "2", *args, *common], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode in (0, 1), proc.stdout + proc.stderr
        for w in workers:
            w.popen.wait(30)
    finally:
        for w in workers:
            w.stop()


@pytest.mark.slow
@pytest.mark.parametrize("distributed", [False, True], ids=["single", "master+2"])
@pytest.mark.parametrize("fmt", list(CASES))
def test_each_format_replays_open_loop(synthetic_server, tmp_path: Path, fmt: str, distributed: bool) -> None:
    flags, kind = CASES[fmt]
    out = tmp_path / "out"
    _load(out, _host(synthetic_server, kind), flags, distributed)
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"]["requests"] == len(recs) > 0
    # a prompt set runs until -t: the request in flight then is STOPPED; a trace ends the run itself
    assert all(r["ok"] or r["status"] == "STOPPED" for r in recs), [r["error"] for r in recs if not r["ok"]][:3]
    if distributed:
        assert {r["worker"] for r in recs} == {"0", "1"}
    adapter = TypeAdapter(RequestRecord)
    for rec in recs:  # trace_index included: every key declared, every value of its type
        assert rec.keys() <= RequestRecord.__required_keys__ | RequestRecord.__optional_keys__
        adapter.validate_python(rec, strict=True)
    if fmt in ("azure", "mooncake"):
        entries = traces.read(flags[1])
        # every scheduled request exactly once: no duplicate, no drop; the run ended with the trace
        assert Counter(r["trace_index"] for r in recs) == Counter(range(len(entries)))
        assert all(r["ok"] for r in recs)
        assert summary["meta"]["duration_s"] < 5.0
        by_index = {r["trace_index"]: r for r in recs}
        for e in entries:  # max_tokens from the output length (the synthetic engine ignores EOS)
            assert by_index[e.index]["tokens_out"] == max(1, e.output_tokens)
        # open loop: sent at the trace's times (x0.5), not back to back
        sent = sorted(r["ts"] for r in recs)
        assert sent[-1] - sent[0] == pytest.approx(entries[-1].at_ms * 0.5 / 1000, abs=0.25)
    else:
        wanted = Counter(
            p.max_tokens or 16
            for p in prompts.build("sharegpt" if fmt == "sharegpt" else "file", path=flags[3], tokenizer="none").prompts
        )
        assert {r["tokens_out"] for r in recs if r["ok"]} <= set(wanted)
        assert "trace_index" not in recs[0]
        assert summary["meta"]["arrival"] == "constant"
