"""The load generator's prompt sets: those cut from a base text to exact lengths (fixed, sweep,
mixed: :mod:`pathprobe.models.prompts`) and those read from files (a JSONL of prompts or token
counts, a ShareGPT file: :mod:`pathprobe.loadgen.datasets`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pathprobe.errors import ConfigError
from pathprobe.models.prompts import (
    CUT_SETS,
    DEFAULT_LENGTHS,
    DEFAULT_PROMPT,
    Prompt,
    PromptSet,
    Tokenizer,
    cut,
    exact_length,
    exact_length_cached,
    is_word_tokenizer,
    load_tokenizer,
    parse_int_list,
)

__all__ = [
    "DEFAULT_LENGTHS",
    "DEFAULT_PROMPT",
    "PROMPT_SETS",
    "Prompt",
    "PromptSet",
    "Tokenizer",
    "build",
    "exact_length",
    "exact_length_cached",
    "from_file",
    "is_word_tokenizer",
    "load_tokenizer",
    "parse_int_list",
]

#: the prompt sets of ``--prompt-set``
PROMPT_SETS = (*CUT_SETS, "file", "sharegpt")


def from_file(path: str, tok: Tokenizer | None, corpus_path: str = "") -> list[Prompt]:
    """JSONL: one ``{"prompt": str}`` or ``{"input_tokens": N}`` per line, each with an optional
    ``max_tokens`` / ``output_tokens`` (a bare JSON string also works); see
    :func:`pathprobe.loadgen.datasets.read_jsonl`."""
    from pathprobe.loadgen import datasets

    corpus = datasets.load_corpus(corpus_path, tok if tok is not None else load_tokenizer("none"))
    return datasets.read_jsonl(path, tok, corpus)


def build(
    kind: str,
    *,
    base: str = DEFAULT_PROMPT,
    tokens: int = 64,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    path: str | None = None,
    tokenizer: str = "tiny",
    seed: int = 0,
    corpus: str = "",
) -> PromptSet:
    if kind in CUT_SETS:
        return cut(kind, base=base, tokens=tokens, lengths=lengths, tokenizer=tokenizer, seed=seed)
    if kind == "file":
        if not path:
            raise ConfigError("prompt-file: --prompt-set file needs --prompt-file PATH")
        t = load_tokenizer(tokenizer)
        return PromptSet(from_file(path, None if is_word_tokenizer(t) else t, corpus))
    if kind == "sharegpt":
        if not path:
            raise ConfigError("prompt-file: --prompt-set sharegpt needs --prompt-file PATH (ShareGPT JSON)")
        from pathprobe.loadgen import datasets

        return PromptSet(datasets.read_sharegpt(path, load_tokenizer(tokenizer)))
    raise ConfigError(f"prompt-set: unknown set {kind!r} ({', '.join(PROMPT_SETS)})")
