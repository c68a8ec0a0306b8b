"""Tokenizers of the same kind and vocabulary size as a published model's, trained here.

A preset's latency should include a tokenizer that costs what the real one costs, so
each preset names the real tokenizer's *kind* and *vocabulary size*
(:class:`TokenizerSpec`), and :func:`build` trains one like it on a deterministic
corpus (the embedded English text, many times, plus seeded pseudo-words so the trainer
can reach a vocabulary of 100k+ merges):

- ``bpe``: byte-level BPE (GPT-2 / GPT-NeoX, Llama-3 / tiktoken, Qwen2, DeepSeek), trained
  with Hugging Face ``tokenizers``; ``pretok`` picks the published pre-tokenizer regex;
- ``sentencepiece``: a SentencePiece BPE model with byte fallback (Llama-2 / Phi-3),
  trained with the ``sentencepiece`` library (``tokenizer.model``) and converted to a
  ``tokenizer.json`` for the fast path.

Two ways to encode the same vocabulary (:func:`load_slow`), as transformers 4.x offered
with ``use_fast=False``, which transformers 5 no longer has:

- fast: the Rust ``tokenizers`` pipeline (``tokenizer.json``), what the server uses;
- slow: ``bpe`` — the pure-Python byte-level BPE of transformers 4.x's ``GPT2Tokenizer`` /
  ``Qwen2Tokenizer`` (regex split, byte-to-unicode map, rank-ordered merges, per-word
  cache); ``sentencepiece`` — the ``sentencepiece`` processor with a Python piece-to-id
  step, as 4.x's slow ``LlamaTokenizer``. Both give the same ids as the fast one (tested).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pathprobe.errors import ConfigError

#: published pre-tokenizer regexes (split before byte-level BPE)
_CL100K = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
PRETOKENIZERS = {"gpt2": _GPT2, "cl100k": _CL100K, "qwen2": _QWEN2}

SLOW_FILE = "pathprobe_tokenizer.json"  # what load_slow needs to know (kind, regex, specials)
CORPUS_SEED = 20261201


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """The published tokenizer a preset imitates."""

    kind: Literal["bpe", "sentencepiece"]
    vocab_size: int  # regular tokens (merges + base alphabet), special tokens come on top
    pretok: str = "gpt2"  # bpe only: a key of PRETOKENIZERS
    source: str = ""  # what the real one is, for the docs

    def scaled(self, vocab_size: int) -> TokenizerSpec:
        return TokenizerSpec(self.kind, vocab_size, self.pretok, self.source)


# --- corpus --------------------------------------------------------------------------------
_LETTER_FREQ = (
    8.2,
    1.5,
    2.8,
    4.3,
    12.7,
    2.2,
    2.0,
    6.1,
    7.0,
    0.2,
    0.8,
    4.0,
    2.4,
    6.7,
    7.5,
    1.9,
    0.1,
    6.0,
    6.3,
    9.1,
    2.8,
    1.0,
    2.4,
    0.2,
    2.0,
    0.1,
)


def corpus(english: str, vocab_size: int) -> list[str]:
    """Deterministic training lines: the English text (repeated, so its words merge first)
    and enough seeded pseudo-words for ``vocab_size`` merges."""
    rng = random.Random(CORPUS_SEED)
    lines = english.splitlines(keepends=True) * 20
    n_lines = max(200, vocab_size // 2)
    letters = string.ascii_lowercase
    for i in range(n_lines):
        words = []
        for _ in range(12):
            w = "".join(rng.choices(letters, _LETTER_FREQ, k=rng.randint(3, 11)))
            r = rng.random()
            if r < 0.1:
                w = w.capitalize()
            elif r < 0.13:
                w = str(rng.randint(0, 99999))
            words.append(w)
        lines.append(" ".join(words) + (".\n" if i % 3 else ",\n"))
    return lines


# --- training ------------------------------------------------------------------------------
def _train_bpe(spec: TokenizerSpec, lines: list[str], specials: list[str]) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    if spec.pretok not in PRETOKENIZERS:
        raise ConfigError(f"tokenizer pretok: unknown {spec.pretok!r} ({', '.join(PRETOKENIZERS)})")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZERS[spec.pretok]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size + len(specials),
        min_frequency=1,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def _train_sentencepiece(spec: TokenizerSpec, lines: list[str], specials: list[str], folder: Path) -> Any:
    import io

    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, models, normalizers

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="bpe",
        vocab_size=spec.vocab_size,
        byte_fallback=True,
        character_coverage=1.0,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        num_threads=4,
        minloglevel=2,
        max_sentence_length=1 << 16,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        seed_sentencepiece_size=1 << 20,
    )
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    scores = {p: sp.get_score(i) for p, i in vocab.items()}
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=_spm_merges(vocab, scores),
            unk_token=sp.id_to_piece(0),
            byte_fallback=True,
            fuse_unk=True,
        )
    )
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(specials)
    return tok


def _spm_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """A SentencePiece BPE model's merges, ordered by the merged piece's score (as
    transformers' converter does): for every piece, each split into two known pieces."""
    merges: list[tuple[float, int, int, str, str]] = []
    for piece in vocab:
        for i in range(1, len(piece)):
            a, b = piece[:i], piece[i:]
            if a in vocab and b in vocab:
                merges.append((-scores[piece], vocab[a], vocab[b], a, b))
    merges.sort()
    return [(a, b) for *_, a, b in merges]


def build(spec: TokenizerSpec, folder: Path, english: str, specials: list[str]) -> Any:
    """Train the tokenizer into ``folder``: returns the ``tokenizers.Tokenizer`` (fast),
    and writes what :func:`load_slow` needs."""
    lines = corpus(english, spec.vocab_size)
    if spec.kind == "bpe":
        tok = _train_bpe(spec, lines, specials)
    elif spec.kind == "sentencepiece":
        tok = _train_sentencepiece(spec, lines, specials, folder)
    else:
        raise ConfigError(f"tokenizer kind: unknown {spec.kind!r} (bpe, sentencepiece)")
    meta = {
        "kind": spec.kind,
        "vocab_size": spec.vocab_size,
        "pretok": spec.pretok,
        "source": spec.source,
        "special_tokens": {s: tok.token_to_id(s) for s in specials},
    }
    (folder / SLOW_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return tok


# --- slow tokenizers -------------------------------------------------------------------------
@lru_cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class SlowByteLevelBPE:
    """Byte-level BPE in Python, the algorithm of transformers 4.x's slow GPT2Tokenizer."""

    def __init__(self, folder: Path, meta: dict[str, Any]) -> None:
        import regex

        model = json.loads((folder / "tokenizer.json").read_text())["model"]
        self.encoder: dict[str, int] = model["vocab"]
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.pat = regex.compile(PRETOKENIZERS[meta["pretok"]])
        self.byte_map = _bytes_to_unicode()
        self.specials: dict[str, int] = meta["special_tokens"]
        self.cache: dict[str, list[str]] = {}

    def _bpe(self, token: str) -> list[str]:
        if token in self.cache:
            return self.cache[token]
        word = list(token)
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if best not in self.ranks:
                break
            a, b = best
            out, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            word = out
        self.cache[token] = word
        return word

    def encode(self, text: str, bos: int | None = None) -> list[int]:
        ids = [] if bos is None else [bos]
        for piece in self.pat.findall(text):
            mapped = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self._bpe(mapped))
        return ids


class SlowSentencePiece:
    """The sentencepiece processor plus a Python piece -> id step (4.x's slow LlamaTokenizer)."""

    def __init__(self, folder: Path, meta: dict[str, Any]) -> None:
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
        self.encoder = {self.sp.id_to_piece(i): i for i in range(self.sp.get_piece_size())}
        self.specials: dict[str, int] = meta["special_tokens"]

    def encode(self, text: str, bos: int | None = None) -> list[int]:
        ids = [] if bos is None else [bos]
        ids.extend(self.encoder[p] for p in self.sp.encode(text, out_type=str))
        return ids


def load_slow(folder: Path) -> SlowByteLevelBPE | SlowSentencePiece:
    """The slow encoder of a tokenizer :func:`build` wrote into ``folder``."""
    meta_path = folder / SLOW_FILE
    if not meta_path.is_file():
        raise ConfigError(f"tokenizer=slow: {folder} has no {SLOW_FILE} (only pathprobe presets have a slow tokenizer)")
    meta = json.loads(meta_path.read_text())
    if meta["kind"] == "sentencepiece":
        return SlowSentencePiece(folder, meta)
    return SlowByteLevelBPE(folder, meta)
