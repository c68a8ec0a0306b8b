"""Prompt sources in the formats the field uses, and prompts of a given token length cut from a
corpus.

- ShareGPT-style conversation JSON (``--prompt-set sharegpt``): a JSON array of
  ``{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}``;
  as vLLM's benchmarks read it, each entry with at least two turns gives one prompt (the first
  turn's text) whose ``max_tokens`` is the second turn's length in the tokenizer.
- JSON lines (``--prompt-set file``): ``{"prompt": "...", "max_tokens": M}`` (text), or
  ``{"input_tokens": N, "output_tokens": M}`` (token counts: a prompt of N tokens is cut from
  the corpus); ``output_tokens`` and ``max_tokens`` are the same field.
- Trace requests (:mod:`pathprobe.loadgen.traces`): an input length and, for Mooncake, the
  hash ids of its 512-token blocks.

A prompt of N tokens is built from blocks of :data:`~pathprobe.loadgen.traces.BLOCK_TOKENS`
tokens, each cut from the corpus (``--corpus FILE``, else a built-in text) at an offset derived
from the block's key, so the same key gives the same text: requests that share hash ids share
that prompt prefix byte for byte, and requests without hash ids get blocks of their own (no
accidental prefix sharing). Each block's cut is adjusted until its text re-encodes to the
block's length; the joined prompt matches the requested length to within a token or so per
block boundary (the server's own count is what the record keeps when the server reports one).

Errors name the file, the line and the field (:class:`~pathprobe.errors.ConfigError`), before
any request is sent.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Sequence
from functools import lru_cache

from pathprobe import jsonl
from pathprobe.errors import ConfigError
from pathprobe.loadgen.traces import BLOCK_TOKENS
from pathprobe.models.prompts import Prompt, Tokenizer, is_word_tokenizer

#: the default corpus: plain prose, cut into blocks at key-derived offsets
DEFAULT_CORPUS = (
    "A river that starts in the mountains carries more than water. In spring it moves gravel and "
    "sand, in summer it warms and slows, and by autumn it has cut a new bend into the meadow below "
    "the old mill. People who live along it learn to read it: the colour after rain, the sound of "
    "the stones at night, the line of foam that shows where the current turns. Engineers measure "
    "the same things with gauges and satellites, and still the river surprises them. A bridge built "
    "for a hundred-year flood meets two of them in a decade. A weir meant to hold fish back becomes "
    "a ladder they climb. Maps are redrawn, and the new maps are wrong again within a generation. "
    "The town library keeps a shelf of notebooks written by the ferry keepers who worked the crossing "
    "before the bridge. They recorded the height of the water every morning, the weather, the number "
    "of passengers, the price of a crossing, and now and then a sentence about a heron, a drowned "
    "cart, a wedding party that sang all the way across. Read in order, the notebooks describe a "
    "climate shifting slowly under ordinary days. Read at random, they are a list of small events "
    "that nobody else wrote down. Historians use them to date floods; children use them to learn the "
    "names of birds; a few readers simply like the handwriting, which changes every thirty years or "
    "so as one keeper hands the work to the next. Downstream the valley widens into farmland, then "
    "into a delta of channels and reed beds where the river forgets it was ever one stream. Boats "
    "that once carried grain now carry tourists, and the warehouses along the quay have become "
    "workshops, a school of music, a bakery that opens at four in the morning. The tide reaches "
    "farther inland each year. Sensors on the harbour wall send their readings every minute to a "
    "server that nobody in town has seen, and the readings come back as a chart on the council's "
    "website, a thin blue line rising and falling with the moon."
)


class Corpus:
    """Token (or word) units of a text, cut into prompts of a given length.

    With a real tokenizer the units are token ids and a piece is their decoded text; with
    ``--tokenizer none`` they are whitespace words."""

    def __init__(self, text: str, tok: Tokenizer) -> None:
        self.tok = tok
        self.words = is_word_tokenizer(tok)
        units: list[int] | list[str] = text.split() if self.words else tok.encode(text)
        if len(units) < 8:
            raise ConfigError("corpus: the text is too short to cut prompts from (fewer than 8 tokens)")
        self._units = units
        self._block = lru_cache(maxsize=8192)(self._make_block)

    def count(self, text: str) -> int:
        return len(text.split()) if self.words else len(self.tok.encode(text))

    def _piece(self, start: int, n: int) -> str:
        units = self._units
        size = len(units)
        picked = [units[(start + i) % size] for i in range(n)]
        if self.words:
            return " ".join(str(u) for u in picked)
        return self.tok.decode([int(u) for u in picked])

    def _make_block(self, key: str, n: int) -> str:
        """``n`` units cut at the offset ``key`` selects; with a tokenizer, a cut that re-encodes to ``n``."""
        start = zlib.crc32(key.encode()) % len(self._units)
        if self.words:
            return self._piece(start, n)
        for cut in (n, n - 1, n + 1, n - 2, n + 2):
            if cut <= 0:
                continue
            text = self._piece(start, cut)
            if self.count(text) == n:
                return text
        return self._piece(start, n)

    def prompt(self, n: int, keys: Sequence[str]) -> str:
        """``n`` tokens: one block per key (the last one cut short), then blocks of ``keys[-1]``'s own."""
        if n <= 0:
            return ""
        parts: list[str] = []
        left = n
        i = 0
        key, take = "", 0
        while left > 0:
            take = min(BLOCK_TOKENS, left)
            key = keys[i] if i < len(keys) else f"{keys[-1] if keys else ''}+{i}"
            parts.append(self._block(key, take))
            left -= take
            i += 1
        text = " ".join(parts)
        if self.words or len(parts) == 1:
            return text
        for _ in range(2):  # the joins cost a token here and there: taken off the last block
            diff = self.count(text) - n
            if diff == 0 or take - diff <= 0:
                break
            take -= diff
            parts[-1] = self._block(key, take)
            text = " ".join(parts)
        return text


def load_corpus(path: str, tok: Tokenizer) -> Corpus:
    """``--corpus FILE`` (UTF-8 text), else the built-in text."""
    if not path:
        return Corpus(DEFAULT_CORPUS, tok)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"corpus: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return Corpus(text, tok)


def request_keys(index: int, n_tokens: int, hash_ids: Sequence[int] = ()) -> list[str]:
    """Block keys of a request: its hash ids (shared prefix text), else keys of its own."""
    if hash_ids:
        return [f"h{h}" for h in hash_ids]
    blocks = max(1, -(-n_tokens // BLOCK_TOKENS))
    return [f"r{index}.{j}" for j in range(blocks)]


# --- files ----------------------------------------------------------------------------------------
def _positive(path: str, line: int, field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"prompt-file: {path}:{line}: {field}: expected a positive integer, got {value!r}")
    if value <= 0:
        raise ConfigError(f"prompt-file: {path}:{line}: {field}: must be > 0, got {value}")
    return value


def read_jsonl(path: str, tok: Tokenizer | None, corpus: Corpus | None = None) -> list[Prompt]:
    """``{"prompt": str}`` or ``{"input_tokens": N}`` per line, each with an optional
    ``max_tokens`` / ``output_tokens`` (a bare JSON string is a prompt too). ``corpus``: what
    token-count lines are cut from (needed only when the file has such lines)."""
    out: list[Prompt] = []
    for line, obj in jsonl.read(path, "prompt-file", ConfigError):
        if isinstance(obj, str):
            obj = {"prompt": obj}
        if not isinstance(obj, dict):
            raise ConfigError(f"prompt-file: {path}:{line}: expected a JSON object, got {type(obj).__name__}")
        mt: int | None = None
        for key in ("max_tokens", "output_tokens"):
            if obj.get(key) is not None:
                mt = _positive(path, line, key, obj[key])
        if "prompt" in obj:
            text = obj["prompt"]
            if not isinstance(text, str) or not text:
                raise ConfigError(f"prompt-file: {path}:{line}: prompt: expected a non-empty string")
            out.append(Prompt(text, len(tok.encode(text)) if tok is not None else None, mt))
        elif "input_tokens" in obj:
            n = _positive(path, line, "input_tokens", obj["input_tokens"])
            if corpus is None:
                raise ConfigError(f"prompt-file: {path}:{line}: input_tokens: needs a tokenizer or --tokenizer none")
            text = corpus.prompt(n, request_keys(len(out), n))
            out.append(Prompt(text, corpus.count(text), mt))
        else:
            raise ConfigError(f"prompt-file: {path}:{line}: prompt: missing (give 'prompt' or 'input_tokens')")
    if not out:
        raise ConfigError(f"prompt-file: {path} holds no prompts")
    return out


def _entries_with_lines(path: str, text: str) -> list[tuple[int, object]]:
    """The items of a top-level JSON array with the line each starts on."""
    dec = json.JSONDecoder()
    i = len(text) - len(text.lstrip())
    if not text[i : i + 1] == "[":
        raise ConfigError(
            f"prompt-file: {path}:{text.count(chr(10), 0, i) + 1}: expected a JSON array of conversations"
        )
    i += 1
    out: list[tuple[int, object]] = []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text):
            raise ConfigError(f"prompt-file: {path}:{text.count(chr(10)) + 1}: malformed JSON: the array is not closed")
        if text[i] == "]":
            return out
        line = text.count("\n", 0, i) + 1
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError as exc:
            raise ConfigError(f"prompt-file: {path}:{line}: malformed JSON: {exc}") from None
        out.append((line, obj))


def _sharegpt(path: str) -> list[list[tuple[str, str]]]:
    """Every conversation of a ShareGPT file as ``(from, value)`` turns, checked."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"prompt-file: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    out: list[list[tuple[str, str]]] = []
    for line, entry in _entries_with_lines(path, text):
        where = f"prompt-file: {path}:{line}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected an object with 'conversations', got {type(entry).__name__}")
        conv = entry.get("conversations")
        if not isinstance(conv, list):
            raise ConfigError(f"{where}: conversations: missing or not a list")
        turns: list[tuple[str, str]] = []
        for j, turn in enumerate(conv):
            if not isinstance(turn, dict):
                raise ConfigError(f"{where}: conversations[{j}]: expected an object with 'from' and 'value'")
            who, value = turn.get("from"), turn.get("value")
            if not isinstance(who, str):
                raise ConfigError(f"{where}: conversations[{j}].from: missing or not a string")
            if not isinstance(value, str):
                raise ConfigError(f"{where}: conversations[{j}].value: missing or not a string")
            turns.append((who, value))
        out.append(turns)
    return out


def _counter(tok: Tokenizer) -> Callable[[str], int]:
    if is_word_tokenizer(tok):
        return lambda s: len(s.split())
    return lambda s: len(tok.encode(s))


def read_sharegpt(path: str, tok: Tokenizer) -> list[Prompt]:
    """One prompt per conversation of two turns or more: the first turn's text, ``max_tokens``
    the second turn's length (vLLM's benchmarks' reading of ShareGPT)."""
    count = _counter(tok)
    out: list[Prompt] = []
    for conv in _sharegpt(path):
        if len(conv) < 2 or not conv[0][1].strip():
            continue  # what vLLM skips: nothing to answer, or no answer to size max_tokens by
        out.append(Prompt(conv[0][1], count(conv[0][1]), max(1, count(conv[1][1]))))
    if not out:
        raise ConfigError(f"prompt-file: {path} holds no conversation of two turns or more")
    return out


#: the speakers of a ShareGPT turn, by side
ASKS = ("human", "user")
ANSWERS = ("gpt", "assistant", "chatgpt", "bard", "bing", "model")


def read_sharegpt_conversations(path: str, tok: Tokenizer) -> list[list[Prompt]]:
    """``--sessions`` over ShareGPT: per conversation, each user turn that has a reply, as a
    prompt whose ``max_tokens`` is that reply's length (the history sent is the server's replies)."""
    count = _counter(tok)
    out: list[list[Prompt]] = []
    for conv in _sharegpt(path):
        turns = [
            Prompt(ask, count(ask), max(1, count(conv[i + 1][1])))
            for i, (who, ask) in enumerate(conv[:-1])
            if who.lower() in ASKS and conv[i + 1][0].lower() in ANSWERS and ask.strip()
        ]
        if turns:
            out.append(turns)
    if not out:
        raise ConfigError(f"prompt-file: {path} holds no conversation with a user turn and its reply")
    return out


def check_inputs(trace: str, trace_format: str, prompt_set: str, prompt_file: str, corpus: str = "") -> None:
    """Read the run's input files as the load processes will (without the tokenizer): a bad line,
    a missing column or field, a negative length fails here, before Locust starts."""
    from pathprobe.loadgen import traces
    from pathprobe.models.prompts import load_tokenizer

    words = load_tokenizer("none")
    if corpus:
        load_corpus(corpus, words)
    if trace:
        traces.read(trace, trace_format)
    elif prompt_file and prompt_set == "sharegpt":
        read_sharegpt(prompt_file, words)
    elif prompt_file and prompt_set == "file":
        read_jsonl(prompt_file, None, load_corpus("", words))
