"""Conversations by turn: the summary's per-turn TTFT and cached share, from raw records (exact,
merged across workers, "not reported" where no server reported a hit) and end to end on our server
with the tiny model, prefix cache on and off (real server, real load generator, no mocks)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pathprobe.errors import ConfigError
from pathprobe.loadgen.config import Config
from pathprobe.loadgen.prompts import Prompt
from pathprobe.loadgen.records import Aggregator
from pathprobe.loadgen.sessions import Session, first_message_tag
from pathprobe.loadgen.turns import TurnTable

from tests.support.procs import Server


def _rec(turn: int, e2e: float, ttft: float | None, tokens_in: int | None, cached: int | None) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "ok": True,
        "route": "openai-chat-stream",
        "status": "OK",
        "ts": 1.0,
        "e2e_ms": e2e,
        "latency_ms": e2e,
        "client_encode_ms": 0.0,
        "client_decode_ms": 0.0,
        "schedule_lag_ms": 0.0,
        "ttft_ms": ttft,
        "tokens_in": tokens_in,
        "session_id": f"s{turn}",
        "turn": turn,
    }
    if cached is not None:
        rec["cached_tokens"] = cached
    return rec


def test_turn_figures_are_exact_and_never_guess_a_hit() -> None:
    recs = [
        _rec(0, 10.0, 4.0, 100, 0),
        _rec(0, 12.0, 6.0, 100, 0),
        _rec(1, 8.0, 2.0, 200, 150),
        _rec(1, 9.0, 3.0, 300, 150),
        _rec(2, 7.0, None, 400, None),  # unary, no hit reported
    ]
    agg = Aggregator()
    agg.add_batch(recs)
    turns = agg.summary({})["routes"]["openai-chat-stream"]["turns"]
    assert [t["turn"] for t in turns] == [0, 1, 2]
    assert turns[0]["cached_share"] == 0.0 and turns[0]["cached_reported"] == 2
    assert turns[1]["cached_share"] == pytest.approx(300 / 500) and turns[1]["prompt_tokens_mean"] == 250
    assert turns[1]["ttft_ms"] == {"count": 2, "p50": 2.0, "p90": 3.0}
    assert turns[2]["cached_share"] is None and turns[2]["cached_reported"] == 0  # not reported, not 0
    assert turns[2]["ttft_ms"] is None and turns[2]["e2e_ms"] == {"count": 1, "p50": 7.0, "p90": 7.0}

    # two workers' shares merge exactly into the one-process figures
    a, b = Aggregator(), Aggregator()
    a.add_batch(recs[:3])
    b.add_batch(recs[3:])
    merged = Aggregator()
    merged.merge_wire(json.loads(json.dumps(a.to_wire())))
    merged.merge_wire(json.loads(json.dumps(b.to_wire())))
    assert merged.summary({})["routes"]["openai-chat-stream"]["turns"] == turns
    # a run without sessions has no by-turn figures
    plain = Aggregator()
    plain.add_batch([{k: v for k, v in r.items() if k not in ("turn", "session_id")} for r in recs])
    assert "turns" not in plain.summary({})["routes"]["openai-chat-stream"]
    assert not TurnTable()


def test_first_messages_are_unique_per_session_behind_a_shared_system_prompt() -> None:
    p = Prompt("the same prompt for everyone", 5)
    a = Session("0-0-0", 2, system="be brief", tag=first_message_tag("r1", "0-0-0"))
    b = Session("0-1-0", 2, system="be brief", tag=first_message_tag("r1", "0-1-0"))
    ta, tb = a.turn(p), b.turn(p)
    assert ta.messages[0] == tb.messages[0] == {"role": "system", "content": "be brief"}
    assert ta.messages[1]["content"] != tb.messages[1]["content"]
    assert ta.messages[1]["content"].endswith(p.text) and ta.prompt.startswith("system: be brief\nuser: ")
    a.answered(ta, "ok")
    t1 = a.turn(p)  # later turns: the history (tagged first message included), the new message as it is
    assert t1.prompt.startswith(ta.prompt) and t1.messages[-1]["content"] == p.text
    assert Session("0-0-1", 1).turn(p).messages == [{"role": "user", "content": p.text}]  # untagged: as it is
    with pytest.raises(ConfigError, match="system-prompt-tokens"):
        Config(system_prompt_tokens=-1)


SYSTEM_TOKENS = 16
USER_TOKENS = 48


def _load(out: Path, url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A 4 s conversation run (chat, streamed): the summary's turns and the OK records."""
    cmd = [sys.executable, "-m", "pathprobe", "load", "--headless", "--only-summary", "-L", "WARNING"]
    cmd += ["-H", f"openai+{url}", "--openai-api", "chat", "--stream", "--model", "tiny", "--out", str(out)]
    cmd += ["-u", "2", "-r", "10", "-t", "4s", "--sessions", "--turns", "3", "--max-tokens", "4"]
    cmd += ["--prompt-tokens", str(USER_TOKENS), "--system-prompt-tokens", str(SYSTEM_TOKENS)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    (route,) = summary["routes"].values()
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line]
    return list(route["turns"]), [r for r in recs if r["ok"]]


@pytest.fixture(scope="module")
def uncached_server(tmp_path_factory) -> Iterator[Server]:
    srv = Server(
        tmp_path_factory.mktemp("tiny-nocache"), "--engine", "transformers", "--model", "tiny", "--engine-option",
        "prefix_cache=0",
    )  # fmt: skip
    yield srv
    srv.stop()


@pytest.mark.slow
def test_turn_one_on_shows_the_prefix_cache_hit_turn_zero_none(tiny_server: Server, tmp_path: Path) -> None:
    turns, recs = _load(tmp_path, tiny_server.http_url)
    assert len(turns) >= 2 and all(t["requests"] >= 2 for t in turns[:2]), turns
    t0, t1 = turns[0], turns[1]
    assert t0["cached_reported"] == t0["requests"] and t1["cached_reported"] == t1["requests"]
    # turn 0: nothing of the session's own first message (48 tokens and its tag) is cached, only
    # what every session shares (the system prompt and the chat template around it)
    for r in recs:
        if r["turn"] == 0:
            assert r["cached_tokens"] <= r["tokens_in"] - USER_TOKENS, r
    # turn 1: the session's own turn 0 (its prompt at least) comes from the cache
    first = {r["session_id"]: r["tokens_in"] for r in recs if r["turn"] == 0}
    hits = [(r["cached_tokens"], first[r["session_id"]]) for r in recs if r["turn"] == 1 and r["session_id"] in first]
    assert hits and all(c >= 0.8 * p for c, p in hits), hits
    assert t1["cached_share"] > 0.5 and t0["cached_share"] < t1["cached_share"] - 0.2, turns
    assert t1["prompt_tokens_mean"] > t0["prompt_tokens_mean"]
    assert t0["ttft_ms"]["count"] == t0["requests"]


@pytest.mark.slow
def test_with_the_cache_off_no_turn_shows_a_hit(uncached_server: Server, tmp_path: Path) -> None:
    turns, recs = _load(tmp_path, uncached_server.http_url)
    assert len(turns) >= 2 and recs, turns
    # our server reports its count, 0 without a prefix cache: a share of 0, not "not reported"
    assert all(t["cached_share"] == 0.0 for t in turns), turns
    assert all(r["cached_tokens"] == 0 for r in recs)
