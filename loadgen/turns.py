"""Conversations by turn (``--sessions``): per turn of a session, how many requests, their TTFT and
e2e, their prompt tokens, and the share of those the server served from its prefix cache.

Turn ``k`` of every session is one row: turn 0 is the first user message, turn 1+ carries the
history, so a server with a prefix cache should answer turn 1+ faster and report a cached share
above 0. The share is ``sum(cached_tokens) / sum(prompt tokens)`` over the OK requests whose server
reported ``cached_tokens``; where none did it is None ("not reported"), never 0 by guess. Values
are kept raw (a conversation run has few requests per turn) and merged exactly across workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from pathprobe.records import RequestRecord
from typing_extensions import TypedDict


class TurnWire(TypedDict):
    """One turn's raw figures as a worker ships them (lists in ms; sums in tokens)."""

    ok: int
    ttft: list[float]
    e2e: list[float]
    prompt_tokens: int  # over the requests with a prompt-token count
    prompt_counted: int  # requests with a prompt-token count
    cached_tokens: int  # over the requests whose server reported cached_tokens
    cached_prompt_tokens: int  # the prompt tokens of those requests
    cached_reported: int  # requests whose server reported cached_tokens


class Quantiles(TypedDict):
    count: int
    p50: float
    p90: float


class TurnSummary(TypedDict):
    """One turn in summary.json's ``turns`` (per route)."""

    turn: int
    requests: int  # OK requests of this turn
    ttft_ms: Quantiles | None  # None: no first token timed (unary requests)
    e2e_ms: Quantiles | None
    prompt_tokens_mean: float | None  # None: no prompt-token count
    cached_reported: int  # requests whose server reported its prefix-cache hit
    cached_share: float | None  # sum cached / sum prompt over those; None: not reported


class TurnAgg:
    """One turn's figures."""

    __slots__ = (
        "cached_prompt_tokens",
        "cached_reported",
        "cached_tokens",
        "e2e",
        "ok",
        "prompt_counted",
        "prompt_tokens",
        "ttft",
    )

    def __init__(self) -> None:
        self.ok = 0
        self.ttft: list[float] = []
        self.e2e: list[float] = []
        self.prompt_tokens = 0
        self.prompt_counted = 0
        self.cached_tokens = 0
        self.cached_prompt_tokens = 0
        self.cached_reported = 0

    def add(self, rec: RequestRecord) -> None:
        """One OK record of this turn."""
        self.ok += 1
        self.e2e.append(rec["e2e_ms"])
        if (t := rec.get("ttft_ms")) is not None:
            self.ttft.append(t)
        n = rec.get("tokens_in")
        if n is not None:
            self.prompt_tokens += n
            self.prompt_counted += 1
        cached = rec.get("cached_tokens")
        if cached is not None and n is not None:  # a share needs both counts of the same request
            self.cached_tokens += cached
            self.cached_prompt_tokens += n
            self.cached_reported += 1

    def to_wire(self) -> TurnWire:
        return {
            "ok": self.ok,
            "ttft": list(self.ttft),
            "e2e": list(self.e2e),
            "prompt_tokens": self.prompt_tokens,
            "prompt_counted": self.prompt_counted,
            "cached_tokens": self.cached_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "cached_reported": self.cached_reported,
        }

    def merge_wire(self, w: TurnWire) -> None:
        self.ok += w["ok"]
        self.ttft += w["ttft"]
        self.e2e += w["e2e"]
        self.prompt_tokens += w["prompt_tokens"]
        self.prompt_counted += w["prompt_counted"]
        self.cached_tokens += w["cached_tokens"]
        self.cached_prompt_tokens += w["cached_prompt_tokens"]
        self.cached_reported += w["cached_reported"]

    def summary(self, turn: int) -> TurnSummary:
        share = None
        if self.cached_reported and self.cached_prompt_tokens > 0:
            share = round(self.cached_tokens / self.cached_prompt_tokens, 4)
        return {
            "turn": turn,
            "requests": self.ok,
            "ttft_ms": quantiles(self.ttft),
            "e2e_ms": quantiles(self.e2e),
            "prompt_tokens_mean": round(self.prompt_tokens / self.prompt_counted, 1) if self.prompt_counted else None,
            "cached_reported": self.cached_reported,
            "cached_share": share,
        }


def quantiles(values: Sequence[float]) -> Quantiles | None:
    """p50 / p90 (nearest rank: values that were measured) in ms; None when there are none."""
    if not values:
        return None
    p50, p90 = np.percentile(np.asarray(values, dtype=np.float64), [50, 90], method="inverted_cdf")
    return {"count": len(values), "p50": round(float(p50), 3), "p90": round(float(p90), 3)}


class TurnTable:
    """Every turn's figures of one route (empty unless the records carry ``turn``)."""

    __slots__ = ("turns",)

    def __init__(self) -> None:
        self.turns: dict[int, TurnAgg] = {}

    def __bool__(self) -> bool:
        return bool(self.turns)

    def _turn(self, k: int) -> TurnAgg:
        t = self.turns.get(k)
        if t is None:
            t = self.turns[k] = TurnAgg()
        return t

    def add_records(self, oks: Iterable[RequestRecord]) -> None:
        """The OK records (those of a session carry ``turn``; others are not a turn)."""
        for rec in oks:
            k = rec.get("turn")
            if k is not None:
                self._turn(k).add(rec)

    def to_wire(self) -> dict[str, TurnWire]:
        return {str(k): t.to_wire() for k, t in sorted(self.turns.items())}

    def merge_wire(self, data: Mapping[str, TurnWire]) -> None:
        for k, w in data.items():
            self._turn(int(k)).merge_wire(w)

    def merge(self, other: TurnTable) -> None:
        self.merge_wire(other.to_wire())

    def summary(self) -> list[TurnSummary]:
        return [t.summary(k) for k, t in sorted(self.turns.items())]


def format_turns(turns: Sequence[TurnSummary]) -> list[str]:
    """The by-turn table of a headless run (indented under its route)."""
    lines = [
        f"  {'by turn':<9}{'requests':>9}{'ttft p50':>10}{'ttft p90':>10}{'e2e p50':>10}"
        f"{'prompt tok':>12}{'cached share':>16}"
    ]
    for t in turns:
        ttft, e2e = t["ttft_ms"], t["e2e_ms"]
        share = t["cached_share"]
        shown = "not reported" if share is None else f"{100 * share:.1f} %"
        tokens = "-" if t["prompt_tokens_mean"] is None else f"{t['prompt_tokens_mean']:.0f}"
        lines.append(
            f"  {t['turn']:<9}{t['requests']:>9}{_ms(ttft, 'p50'):>10}{_ms(ttft, 'p90'):>10}"
            f"{_ms(e2e, 'p50'):>10}{tokens:>12}{shown:>16}"
        )
    if not any(t["ttft_ms"] for t in turns):
        lines.append("  (TTFT is timed on streams: add --stream)")
    return lines


def _ms(q: Quantiles | None, key: str) -> str:
    if q is None:
        return "-"
    return f"{q['p50'] if key == 'p50' else q['p90']:.2f}"
