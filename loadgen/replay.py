"""Open-loop replay of an arrival trace (``--trace FILE``), shared by the users of one process and
split across the workers of a distributed run.

Each process replays the entries whose index ``i`` has ``i % of == rank`` (a single process:
all of them; worker ``rank`` of ``of``, ranks dealt by the master): every scheduled request is
sent by exactly one process, once. Its users take the entries in order; each sleeps until the
entry's intended send time (``start + at_ms * time_scale``; ``start``: when the first user takes
one) and sends, so when every user is busy the lag between intended and actual send grows
and is recorded (``schedule_lag_ms``), as in :mod:`pathprobe.loadgen.arrival`. A process that
has recorded all its entries says so (:attr:`Replay.finished`), and the run ends when every
process has (:meth:`pathprobe.loadgen.runtime.Runtime.end_run`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pathprobe.errors import ConfigError
from pathprobe.loadgen.datasets import Corpus, request_keys
from pathprobe.loadgen.prompts import Prompt
from pathprobe.loadgen.traces import TraceEntry


@dataclass(frozen=True, slots=True)
class Scheduled:
    entry: TraceEntry
    intended_ns: int  # perf_counter_ns
    prompt: Prompt


class Replay:
    """This process's share of a trace: handed out in order, each entry once."""

    def __init__(
        self,
        entries: list[TraceEntry],
        corpus: Corpus,
        time_scale: float = 1.0,
        rank: int = 0,
        of: int = 1,
        start_ns: int | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ConfigError(f"time-scale: must be > 0, got {time_scale}")
        if of < 1 or not 0 <= rank < of:
            raise ValueError(f"replay: rank {rank} of {of}")
        self.mine = [e for e in entries if e.index % of == rank]
        self.corpus = corpus
        self.time_scale = time_scale
        self.rank, self.of = rank, of
        #: the trace's time 0 (perf_counter_ns): when the first user takes an entry, unless given
        self.start_ns = start_ns
        self._next = 0
        self.recorded = 0

    @property
    def total(self) -> int:
        """The entries this process sends."""
        return len(self.mine)

    @property
    def finished(self) -> bool:
        """Every entry of this process has been recorded."""
        return self.recorded >= len(self.mine)

    def take(self) -> Scheduled | None:
        """The next entry with its send time and prompt (None: this process's share is all taken)."""
        if self._next >= len(self.mine):
            return None
        e = self.mine[self._next]
        self._next += 1
        if self.start_ns is None:  # users spawn after the test starts: the clock starts with the first
            self.start_ns = time.perf_counter_ns()
        n = max(1, e.input_tokens)  # a zero-length prompt is sent as one token
        text = self.corpus.prompt(n, request_keys(e.index, n, e.hash_ids))
        prompt = Prompt(text, n, max(1, e.output_tokens))
        return Scheduled(e, self.start_ns + int(e.at_ms * self.time_scale * 1e6), prompt)

    def done_one(self) -> bool:
        """Count one recorded entry; True when that was this process's last."""
        self.recorded += 1
        return self.recorded == len(self.mine)
