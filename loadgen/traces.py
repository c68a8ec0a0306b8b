"""Arrival traces: when each request of a recorded workload arrived, how long its prompt was and
how many tokens it generated, read from the public traces' own layouts.

- ``azure``: the Azure LLM inference traces (AzurePublicDataset, 2023 "Splitwise" and 2024
  "DynamoLLM"): CSV with the header ``TIMESTAMP,ContextTokens,GeneratedTokens``; ``TIMESTAMP`` is
  a wall-clock time (``2023-11-16 18:15:46.6805900``; a number is read as seconds), arrivals are
  taken relative to the earliest row.
- ``mooncake``: the Mooncake (FAST'25) trace JSONL, one
  ``{"timestamp": ms, "input_length": N, "output_length": M, "hash_ids": [...]}`` per line;
  ``timestamp`` is ms since the first request, and each hash id names one 512-token block of the
  prompt: two requests that share leading hash ids share that much prompt prefix (the layout
  Mooncake's trace README, AIPerf's trace replay and vLLM's benchmarks use).

Every problem (a malformed line, a missing column or key, a negative or non-integer length)
is a :class:`~pathprobe.errors.ConfigError` naming the file, the line and the field, raised
while the file is read: before any request is sent.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import datetime

from pathprobe.errors import ConfigError

FORMATS = ("azure", "mooncake")
#: tokens per Mooncake hash id (the trace's KV-cache block size)
BLOCK_TOKENS = 512
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, slots=True)
class TraceEntry:
    index: int  # position in the replay (sorted by arrival), 0-based
    at_ms: float  # arrival, ms after the trace's first request
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()  # mooncake: the prompt's 512-token blocks (shared ids: shared prefix)
    line: int = 0  # the line of the file it came from


def guess_format(path: str) -> str:
    """``azure`` for a ``.csv``, ``mooncake`` for ``.jsonl`` / ``.json``; else a ConfigError."""
    low = path.lower()
    if low.endswith(".csv"):
        return "azure"
    if low.endswith((".jsonl", ".json")):
        return "mooncake"
    raise ConfigError(f"trace-format: cannot tell the format of {path}; give --trace-format azure|mooncake")


def read(path: str, fmt: str = "") -> list[TraceEntry]:
    """The trace's requests, sorted by arrival (ties keep the file's order), indexed 0..n-1."""
    fmt = fmt or guess_format(path)
    if fmt == "azure":
        raw = _read_azure(path)
    elif fmt == "mooncake":
        raw = _read_mooncake(path)
    else:
        raise ConfigError(f"trace-format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if not raw:
        raise ConfigError(f"trace: {path} holds no requests")
    raw.sort(key=lambda e: e.at_ms)  # stable: ties keep the file's order
    return [TraceEntry(i, e.at_ms, e.input_tokens, e.output_tokens, e.hash_ids, e.line) for i, e in enumerate(raw)]


def _length(path: str, line: int, field: str, value: object) -> int:
    """A token count: a non-negative integer (``12`` or ``"12"``; ``12.0`` too)."""
    n: int | None = None
    if isinstance(value, bool):
        n = None
    elif isinstance(value, int):
        n = value
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    elif isinstance(value, str):
        try:
            n = int(value.strip())
        except ValueError:
            n = None
    if n is None:
        raise ConfigError(f"trace: {path}:{line}: {field}: expected a token count (integer), got {value!r}")
    if n < 0:
        raise ConfigError(f"trace: {path}:{line}: {field}: must be >= 0, got {n}")
    return n


def _azure_time(path: str, line: int, value: str | None) -> float:
    """Seconds (a wall-clock time, or a plain number of seconds)."""
    text = (value or "").strip()
    if not text:
        raise ConfigError(f"trace: {path}:{line}: TIMESTAMP: empty")
    try:
        t = float(text)
    except ValueError:
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError:
            raise ConfigError(
                f"trace: {path}:{line}: TIMESTAMP: expected a time like 2023-11-16 18:15:46.680 "
                f"or seconds, got {text!r}"
            ) from None
    if not math.isfinite(t):
        raise ConfigError(f"trace: {path}:{line}: TIMESTAMP: expected a finite number, got {text!r}")
    return t


def _read_azure(path: str) -> list[TraceEntry]:
    try:
        fh = open(path, encoding="utf-8", newline="")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise ConfigError(f"trace: cannot read {path}: {exc.strerror or exc}") from None
    rows: list[tuple[float, int, int, int]] = []
    with fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise ConfigError(f"trace: {path}:1: empty file (expected the header {','.join(AZURE_COLUMNS)})") from None
        except csv.Error as exc:
            raise ConfigError(f"trace: {path}:1: malformed CSV: {exc}") from None
        cols: dict[str, int] = {}
        for name in AZURE_COLUMNS:
            if name not in header:
                raise ConfigError(
                    f"trace: {path}:1: missing column {name} (the header is {','.join(header)!r}; "
                    f"expected {','.join(AZURE_COLUMNS)})"
                )
            cols[name] = header.index(name)
        width = max(cols.values()) + 1
        try:
            for row in reader:
                line = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) < width:
                    missing = next(n for n, i in cols.items() if i >= len(row))
                    raise ConfigError(f"trace: {path}:{line}: {missing}: missing (the row has {len(row)} columns)")
                t = _azure_time(path, line, row[cols["TIMESTAMP"]])
                n_in = _length(path, line, "ContextTokens", row[cols["ContextTokens"]])
                n_out = _length(path, line, "GeneratedTokens", row[cols["GeneratedTokens"]])
                rows.append((t, n_in, n_out, line))
        except csv.Error as exc:
            raise ConfigError(f"trace: {path}:{reader.line_num}: malformed CSV: {exc}") from None
    if not rows:
        return []
    first = min(r[0] for r in rows)
    return [TraceEntry(0, (t - first) * 1000.0, n_in, n_out, (), line) for t, n_in, n_out, line in rows]


def _read_mooncake(path: str) -> list[TraceEntry]:
    from pathprobe import jsonl

    out: list[TraceEntry] = []
    for line, obj in jsonl.read(path, "trace", ConfigError):
        if not isinstance(obj, dict):
            raise ConfigError(f"trace: {path}:{line}: expected a JSON object, got {type(obj).__name__}")
        for key in ("timestamp", "input_length", "output_length"):
            if key not in obj:
                raise ConfigError(f"trace: {path}:{line}: {key}: missing")
        ts = obj["timestamp"]
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
            raise ConfigError(f"trace: {path}:{line}: timestamp: expected ms (a number), got {ts!r}")
        if ts < 0:
            raise ConfigError(f"trace: {path}:{line}: timestamp: must be >= 0, got {ts}")
        n_in = _length(path, line, "input_length", obj["input_length"])
        n_out = _length(path, line, "output_length", obj["output_length"])
        ids = obj.get("hash_ids", [])
        if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in ids):
            raise ConfigError(f"trace: {path}:{line}: hash_ids: expected a list of integers, got {ids!r}")
        out.append(TraceEntry(0, float(ts), n_in, n_out, tuple(ids), line))
    return out
