"""Prompts of an exact length in a target's tokenizer: the tokenizers (``tiny``, a preset, a
folder, or ``none`` for whitespace words) and the prompt sets cut from a base text (fixed length,
length sweep, mixed lengths), cached on disk per tokenizer.

Lengths are exact in the target's tokenizer: the base text is repeated, then cut to N token ids
and decoded; the cut is adjusted until the text re-encodes to N tokens (no special tokens counted;
a server may add a BOS of its own). The load generator's prompt sets that read files (a JSONL, a
ShareGPT file) build on these (:mod:`pathprobe.loadgen.prompts`); compare cuts its prompts once
here, without the load generator.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pathprobe.errors import ConfigError

DEFAULT_PROMPT = "The capital of France is"
DEFAULT_LENGTHS = (16, 64, 256, 1024)
#: the prompt sets cut from a base text
CUT_SETS = ("fixed", "sweep", "mixed")


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    tokens: int | None  # prompt length in the chosen tokenizer (None: unknown)
    max_tokens: int | None = None  # per-prompt override (file sets)


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...


class _HFTokenizer:
    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


class _RawTokenizer:
    """A ``tokenizer.json`` read with the ``tokenizers`` library alone (no transformers import)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=True))


class _WordTokenizer:
    """Whitespace words: an approximation for targets whose tokenizer is not at hand."""

    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split())))

    def decode(self, ids: Sequence[int]) -> str:  # pragma: no cover - not used for cutting
        raise NotImplementedError


def load_tokenizer(spec: str) -> Tokenizer:
    """``tiny`` / a preset / a local folder (pathprobe.models), or ``none``.

    A folder with a ``tokenizer.json`` is read with ``tokenizers`` alone (neither torch nor
    transformers is needed); any other tokenizer format goes through transformers.
    """
    if spec in ("none", ""):
        return _WordTokenizer()
    from pathprobe import models

    try:
        folder = models.resolve_tokenizer(spec)
    except ModuleNotFoundError as exc:  # a preset's tokenizer is built with transformers (the server's extra)
        raise ConfigError(
            f"tokenizer: building {spec}'s tokenizer needs {exc.name} (pip install 'pathprobe[server]'), "
            "or use --tokenizer tiny or none"
        ) from None
    path = folder / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer as _Tokenizer

        try:
            return _RawTokenizer(_Tokenizer.from_file(str(path)))
        except Exception as exc:  # the library raises its own exception types
            raise ConfigError(f"tokenizer: cannot read {path}: {exc}") from exc
    try:
        return _HFTokenizer(models.load_tokenizer(spec))
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"tokenizer: {folder} has no tokenizer.json, and reading its tokenizer needs "
            f"{exc.name} (pip install transformers), or use --tokenizer none"
        ) from exc


def exact_length(base: str, n: int, tok: Tokenizer) -> Prompt:
    """``base`` repeated/trimmed to exactly ``n`` tokens of ``tok``."""
    if n <= 0:
        raise ConfigError(f"prompt-tokens: must be > 0, got {n}")
    if isinstance(tok, _WordTokenizer):
        words = base.split() or ["x"]
        out = [words[i % len(words)] for i in range(n)]
        return Prompt(" ".join(out), n)
    unit = tok.encode(base)
    if not unit:
        raise ConfigError("prompt: encodes to no tokens")
    # enough repetitions at once (a long prompt re-encoded after every repetition took minutes at
    # 16k tokens), doubled in the rare case the joins encode shorter than the unit alone
    text = " ".join([base] * (-(-(n + 8) // len(unit)) + 1))
    ids = tok.encode(text)
    while len(ids) < n + 8:
        text = text + " " + text
        ids = tok.encode(text)
    # find a cut whose decoded text re-encodes to exactly n tokens
    for cut in (n, n - 1, n + 1, n - 2, n + 2, n - 3, n + 3):
        if cut <= 0:
            continue
        candidate = tok.decode(ids[:cut])
        got = len(tok.encode(candidate))
        if got == n:
            return Prompt(candidate, n)
    candidate = tok.decode(ids[:n])
    return Prompt(candidate, len(tok.encode(candidate)))


def is_word_tokenizer(tok: Tokenizer) -> bool:
    """``--tokenizer none``: whitespace words stand for tokens (nothing to decode)."""
    return isinstance(tok, _WordTokenizer)


def _tokenizer_digest(spec: str) -> str | None:
    """Identity of a tokenizer from its files (no transformers import), or None."""
    from pathprobe import models

    try:
        folder = models.resolve_tokenizer(spec)
    except Exception:
        return None
    h = hashlib.sha256()
    found = False
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model"):
        f = folder / name
        if f.is_file():
            h.update(name.encode())
            h.update(f.read_bytes())
            found = True
    return h.hexdigest()[:24] if found else None


def exact_length_cached(base: str, n: int, spec: str, tok: Callable[[], Tokenizer]) -> Prompt:
    """:func:`exact_length`, remembered on disk per (tokenizer files, text, n), so a run that
    reuses a prompt does not pay the tokenizer's import and load (~10 s on a small machine)."""
    digest = _tokenizer_digest(spec) if spec not in ("none", "") else None
    if digest is None:
        return exact_length(base, n, tok())
    from pathprobe import models

    key = hashlib.sha256(f"{digest}\0{n}\0{base}".encode()).hexdigest()[:32]
    path = models.cache_dir() / "prompts" / f"{key}.json"
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
        return Prompt(obj["text"], int(obj["tokens"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    p = exact_length(base, n, tok())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"text": p.text, "tokens": p.tokens}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs time
    return p


class PromptSet:
    """Hands out prompts: in order (fixed, sweep, file) or at random (mixed)."""

    def __init__(self, prompts: list[Prompt], shuffle: bool = False, seed: int = 0) -> None:
        if not prompts:
            raise ConfigError("prompt-set: no prompts")
        self.prompts = prompts
        self.shuffle = shuffle
        self._rng = random.Random(seed)
        self._i = 0

    def next(self) -> Prompt:
        if self.shuffle:
            return self._rng.choice(self.prompts)
        p = self.prompts[self._i % len(self.prompts)]
        self._i += 1
        return p


def cut(
    kind: str,
    *,
    base: str = DEFAULT_PROMPT,
    tokens: int = 64,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    tokenizer: str = "tiny",
    seed: int = 0,
) -> PromptSet:
    """A prompt set cut from ``base``: ``fixed`` (one length), ``sweep`` (each length in order) or
    ``mixed`` (the lengths at random); the tokenizer is loaded only when a length is not cached."""
    loaded: list[Tokenizer] = []

    def tok() -> Tokenizer:
        if not loaded:
            loaded.append(load_tokenizer(tokenizer))
        return loaded[0]

    if kind == "fixed":
        return PromptSet([exact_length_cached(base, tokens, tokenizer, tok)])
    if kind == "sweep":
        return PromptSet([exact_length_cached(base, n, tokenizer, tok) for n in lengths])
    if kind == "mixed":
        return PromptSet([exact_length_cached(base, n, tokenizer, tok) for n in lengths], shuffle=True, seed=seed)
    raise ConfigError(f"prompt-set: {kind!r} is not cut from a base text ({', '.join(CUT_SETS)})")


def parse_int_list(value: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated integers, got {value!r}") from None
    if not out or any(x <= 0 for x in out):
        raise ConfigError(f"{flag}: expected positive integers, got {value!r}")
    return out
