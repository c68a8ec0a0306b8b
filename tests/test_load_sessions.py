"""Conversations (``--sessions``): turns carry the history (OpenAI chat messages; the native and
gRPC routes the concatenated history), records carry session id and turn, the prefix-cache hit
is recorded only where the server reports it, and the session affinity header is sent."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pathprobe.errors import ConfigError
from pathprobe.loadgen.config import Config
from pathprobe.loadgen.prompts import Prompt
from pathprobe.loadgen.sessions import Session, concatenate
from pathprobe.records import RequestRecord
from pydantic import TypeAdapter


def test_a_session_carries_its_history_into_each_turn() -> None:
    s = Session("w-0-0", 2)
    t0 = s.turn(Prompt("first question", 2, 5))
    assert t0.messages == [{"role": "user", "content": "first question"}] and t0.max_tokens == 5
    s.answered(t0, "an answer")
    t1 = s.turn(Prompt("second", 1))
    assert [m["role"] for m in t1.messages] == ["user", "assistant", "user"] and t1.index == 1
    assert t1.prompt.startswith(t0.prompt + "\nassistant: an answer")  # a prefix cache sees turn 0
    s.answered(t1, "x")
    assert s.done and concatenate(t1.messages) == t1.prompt


def test_session_flags_are_checked() -> None:
    with pytest.raises(ConfigError, match="turns"):
        Config(turns=0)
    with pytest.raises(ConfigError, match="think-time"):
        Config(think_time=-1)
    with pytest.raises(ConfigError, match="sessions"):
        Config(sessions=True, arrival="constant", rate=5)
    with pytest.raises(ConfigError, match="session-header"):
        Config(session_header="x session")


class _Chat(BaseHTTPRequestHandler):
    """OpenAI chat, unary: answers ``reply-<n messages>``; reports cached_tokens from turn 2 on."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[dict[str, str], dict[str, Any]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send({"data": [{"id": "m"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        _Chat.seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
        n = len(body["messages"])
        usage: dict[str, Any] = {"prompt_tokens": 10 * n, "completion_tokens": 2}
        if n > 1:
            usage["prompt_tokens_details"] = {"cached_tokens": 10 * (n - 1)}
        self._send({"choices": [{"message": {"role": "assistant", "content": f"reply-{n}"}}], "usage": usage})


def _run(out: Path, host: str, *args: str) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "pathprobe", "load", "--headless", "--only-summary", "-L", "WARNING"]
    cmd += ["-H", host, "--out", str(out), "--tokenizer", "none", "-u", "2", "-r", "10", "-t", "2s", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    recs = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line]
    adapter = TypeAdapter(RequestRecord)
    for r in recs:
        adapter.validate_python(r, strict=True)
    return [r for r in recs if r["ok"]]


@pytest.mark.slow
def test_chat_sessions_send_messages_header_and_record_cached_tokens(tmp_path: Path) -> None:
    _Chat.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        host = f"openai+http://127.0.0.1:{srv.server_address[1]}"
        recs = _run(
            tmp_path,
            host,
            *("--openai-api", "chat", "--sessions", "--turns", "3", "--think-time", "0.02"),
            *("--session-header", "X-Session-Id", "--max-tokens", "2"),
        )
    finally:
        srv.shutdown()
    assert len(recs) >= 6
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by_session[r["session_id"]].append(r)
        # the prefix-cache hit exactly as reported: absent on turn 0, where the server sent none
        if r["turn"] == 0:
            assert "cached_tokens" not in r
        else:
            assert r["cached_tokens"] == 10 * 2 * r["turn"]
        assert r["tokens_in"] == 10 * (2 * r["turn"] + 1)
    for turns in by_session.values():
        assert [r["turn"] for r in turns] == list(range(len(turns)))
    # what the server got: the session header, and each turn's messages with the earlier replies
    sessions_seen = {h["x-session-id"] for h, _ in _Chat.seen}
    assert set(by_session) <= sessions_seen
    for _, body in _Chat.seen:
        msgs = body["messages"]
        assert [m["role"] for m in msgs] == ["user", "assistant"] * (len(msgs) // 2) + ["user"]
        assert [m["content"] for m in msgs[1::2]] == [f"reply-{2 * i + 1}" for i in range(len(msgs) // 2)]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["http-stream", "grpc"])
def test_native_and_grpc_sessions_send_the_concatenated_history(synthetic_server, tmp_path: Path, kind: str) -> None:
    host = synthetic_server.http_url if kind == "http-stream" else f"grpc://{synthetic_server.grpc_target}"
    extra = ["--stream"] if kind == "http-stream" else []
    recs = _run(tmp_path, host, "--sessions", "--turns", "3", "--max-tokens", "4", "--prompt-tokens", "8", *extra)
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        by_session[r["session_id"]].append(r)
    full = [s for s in by_session.values() if len(s) == 3]
    assert full, by_session
    for turns in full:
        assert [r["turn"] for r in turns] == [0, 1, 2]
        sizes = [r["tokens_in"] for r in turns]  # the server's count: the history grows every turn
        assert sizes[0] < sizes[1] < sizes[2], sizes


SHAREGPT = Path(__file__).resolve().parent / "data" / "datasets" / "sharegpt.json"


def test_sharegpt_conversations_give_each_session_its_user_turns() -> None:
    from pathprobe.loadgen import datasets, prompts

    convs = datasets.read_sharegpt_conversations(str(SHAREGPT), prompts.load_tokenizer("none"))
    assert [[p.text for p in c] for c in convs][1] == [
        "Name three birds that live in reed beds.",
        "Which of them is the loudest?",
    ]
    assert [p.max_tokens for p in convs[1]] == [6, 8]  # each reply's length
    assert len(convs) == 3  # the conversation without a reply has no turn to send


@pytest.mark.slow
def test_sharegpt_sessions_replay_each_conversations_user_turns(tmp_path: Path) -> None:
    _Chat.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        host = f"openai+http://127.0.0.1:{srv.server_address[1]}"
        recs = _run(
            tmp_path,
            host,
            *("--openai-api", "chat", "--sessions", "--turns", "5"),
            *("--prompt-set", "sharegpt", "--prompt-file", str(SHAREGPT)),
        )
    finally:
        srv.shutdown()
    assert recs and max(r["turn"] for r in recs) == 1  # the two-turn conversation, whole
    wanted = {
        ("What is the difference between a weir and a dam?",),
        ("Name three birds that live in reed beds.",),
        ("Name three birds that live in reed beds.", "Which of them is the loudest?"),
        ("Summarise the history of river ferries in two sentences.",),
    }
    for _, body in _Chat.seen:
        asked = tuple(m["content"] for m in body["messages"] if m["role"] == "user")
        # the first message begins with the session's tag (unique per session), then the recorded turn
        assert re.fullmatch(r"[0-9a-f]{8}: conversation \S+\. .+", asked[0]), asked
        asked = (asked[0].split(". ", 1)[1], *asked[1:])
        assert asked in wanted, asked
        assert body["max_tokens"] in (14, 6, 8)
