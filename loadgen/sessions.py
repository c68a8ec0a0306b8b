"""Conversations (``--sessions``): each user runs sessions of ``--turns`` turns one after the other,
waiting ``--think-time`` seconds between two turns, and every turn carries the history so far.

A turn's new user message is the next prompt of the run's prompt set (with ``--prompt-set
sharegpt``: the conversation's own user turns, in order, at most ``--turns``); the reply the server
streamed (or returned) is kept and the next turn sends the whole conversation: as OpenAI chat
``messages`` on ``--openai-api chat``, else (native HTTP, gRPC, OpenAI completions) as one
prompt, the history's messages concatenated (``role: content`` lines), so a server with a prefix
cache can serve turn 2+ from it. Each record carries ``session_id`` and ``turn`` (0-based), and
``cached_tokens`` when the server reports its prefix-cache hit. With ``--session-header NAME``
every turn sends ``NAME: <session id>`` so a router can keep a session on one upstream.

What sessions share: ``--system-prompt-tokens N`` puts one system prompt of N tokens before every
session's first message (the prefix all conversations share, as a deployed assistant's does). The
first user message itself begins with a tag naming the run and the session (unless
``--shared-first-message``), so that turn 0 of one session finds nothing of another session (or of an
earlier run against the same server) in a prefix cache beyond the system prompt: turn 0 shows the
cold prefill, turn 1+ the reuse of the session's own history. The summary shows both by turn
(:mod:`pathprobe.loadgen.turns`).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field

from pathprobe.loadgen.prompts import Prompt


@dataclass(frozen=True, slots=True)
class Turn:
    session_id: str
    index: int  # 0-based turn of the session
    prompt: str  # the whole conversation as one prompt (routes without chat messages)
    messages: list[dict[str, str]]  # the same as chat messages, this turn's user message last
    max_tokens: int | None


@dataclass(slots=True)
class Session:
    """One conversation of ``turns`` turns."""

    session_id: str
    turns: int
    history: list[dict[str, str]] = field(default_factory=list)
    index: int = 0
    #: a recorded conversation's user turns (ShareGPT): sent in order instead of the prompt set's
    script: list[Prompt] = field(default_factory=list)
    #: the system prompt every session shares ("" = none): the history's first message
    system: str = ""
    #: put before the first user message ("" = none): what makes this session's first turn its own
    tag: str = ""

    def __post_init__(self) -> None:
        if self.system and not self.history:
            self.history = [{"role": "system", "content": self.system}]

    def scripted(self) -> Prompt | None:
        """This turn's message from the script, if the session follows one."""
        return self.script[self.index] if self.index < len(self.script) else None

    @property
    def done(self) -> bool:
        return self.index >= self.turns

    def turn(self, prompt: Prompt) -> Turn:
        """The next turn: the history plus ``prompt`` as the new user message (the first one tagged)."""
        text = f"{self.tag} {prompt.text}" if self.tag and self.index == 0 else prompt.text
        messages = [*self.history, {"role": "user", "content": text}]
        return Turn(self.session_id, self.index, concatenate(messages), messages, prompt.max_tokens)

    def answered(self, turn: Turn, reply: str) -> None:
        """Keep the turn and its reply in the history; the session moves to its next turn."""
        self.history = [*turn.messages, {"role": "assistant", "content": reply}]
        self.index += 1


def run_nonce() -> str:
    """A short random id for one run: part of every first-message tag, so a second run against the
    same server does not find the first run's sessions in its cache."""
    return uuid.uuid4().hex[:8]


def first_message_tag(run: str, session_id: str) -> str:
    """The text that begins a session's first user message: a digest of the run and the session
    first (two sessions' first messages part within a token or two), then the session in words."""
    digest = hashlib.blake2s(f"{run}/{session_id}".encode(), digest_size=4).hexdigest()
    return f"{digest}: conversation {session_id}."


def concatenate(messages: list[dict[str, str]]) -> str:
    """The conversation as one prompt: ``role: content`` per message, one per line (a turn's
    prompt begins with the previous turn's prompt and reply, byte for byte; the prompt tokens
    are the server's count)."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)
