"""The model catalog: the models pathprobe serves without downloading anything.

- ``tiny``: a small random-weight Llama-architecture model (head size 32, so vLLM's CPU
  attention accepts it too) and a byte-level BPE tokenizer trained here, on a corpus
  embedded in this module. Built deterministically, once, in the cache folder
  (``$PATHPROBE_CACHE``, else ``~/.cache/pathprobe``); same bytes on the same library
  versions.
- ``preset:NAME``: a real architecture (Llama-3-8B, Qwen2-7B, …) written as a
  ``config.json`` with the published values plus the tiny tokenizer, and no weights:
  the engine builds the model with random weights at load time (``from_config``).
- a path: any local Hugging Face model folder.

A server resolves its model once (:func:`resolve`, a :class:`ResolvedModel`) and hands the
result to its engine. The load generator and ``compare`` use the same catalog for tokenizers
and folders. Heavy libraries (torch, transformers, tokenizers) are imported inside functions
only, so importing this module costs a load-generator install nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pathprobe import environment
from pathprobe.errors import ConfigError
from pathprobe.models.corpus import CORPUS
from pathprobe.models.presets import (
    PRESET_TOKENIZERS,
    PRESETS,
    TINY_MOE,
    TINY_OVERRIDES,
    TINY_TOKENIZER_VOCAB,
)
from pathprobe.models.tokenizer_build import SlowByteLevelBPE, SlowSentencePiece, TokenizerSpec

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

#: Bump when the tiny model's recipe changes (the cache folder name carries it).
TINY_VERSION = 1
#: Bump when a preset's recipe changes (config or tokenizer; the folder name carries it).
PRESET_VERSION = 2
#: ``preset:NAME@tiny``: the same architecture class at test scale (CPU tests, CI)
TINY_SCALE = "tiny"
TINY_SEED = 1234
TINY_VOCAB = 1536

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
PAD = "<|pad|>"
HEADER_START = "<|start_header_id|>"
HEADER_END = "<|end_header_id|>"
EOT = "<|eot_id|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, HEADER_START, HEADER_END, EOT]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

TINY_ARCH: dict[str, Any] = {
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 256,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    # Wider than the usual 0.02 so the random model's logits are well separated: greedy
    # output then does not flip on float rounding between a batch and a single request.
    "initializer_range": 0.5,
    "tie_word_embeddings": False,
}

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


# --- cache folder ----------------------------------------------------------------------
def cache_dir() -> Path:
    root = environment.get(environment.PATHPROBE_CACHE)
    return Path(root).expanduser() if root else Path.home() / ".cache" / "pathprobe"


def tiny_dir() -> Path:
    return cache_dir() / f"tiny-v{TINY_VERSION}"


def has_weights(folder: Path) -> bool:
    return any(any(folder.glob(p)) for p in WEIGHT_PATTERNS)


def _complete(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()


def _publish(tmp: Path, final: Path, complete: Callable[[Path], bool] = _complete) -> None:
    """Move a fully built folder into place; if another process won the race, keep theirs."""
    try:
        os.replace(tmp, final)
    except OSError:
        if not complete(final):
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _build_in_temp(final: Path, build, complete: Callable[[Path], bool] = _complete) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        tmp.chmod(0o755)
        build(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _publish(tmp, final, complete)
    return final


# --- tokenizer -----------------------------------------------------------------------------
def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, bos_id)]
            ),
        ]
    )
    return tok


def _with_bos(tok):
    from tokenizers import processors

    bos_id = tok.token_to_id(BOS)
    steps = [
        processors.TemplateProcessing(
            single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, bos_id)]
        )
    ]
    if tok.pre_tokenizer is not None and "ByteLevel" in repr(tok.pre_tokenizer):
        steps.insert(0, processors.ByteLevel(trim_offsets=False))
    tok.post_processor = processors.Sequence(steps)
    return tok


def _save_tokenizer(folder: Path, spec: TokenizerSpec | None = None, max_len: int | None = None) -> dict[str, int]:
    """Write a tokenizer into ``folder``: the tiny one, or one trained like ``spec``."""
    from pathprobe.models import tokenizer_build
    from transformers import PreTrainedTokenizerFast

    raw = _train_tokenizer() if spec is None else _with_bos(tokenizer_build.build(spec, folder, CORPUS, SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_len or TINY_ARCH["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    tok.padding_side = "left"
    tok.save_pretrained(str(folder))
    return {
        "vocab": len(tok),
        "bos": _token_id(tok, BOS),
        "eos": _token_id(tok, EOS),
        "pad": _token_id(tok, PAD),
        "eot": _token_id(tok, EOT),
    }


def _token_id(tok: Any, token: str) -> int:
    """The id of one special token (``convert_tokens_to_ids`` is typed for lists too)."""
    i = tok.convert_tokens_to_ids(token)
    if not isinstance(i, int):
        raise TypeError(f"tokenizer: no single id for {token!r}: {i!r}")
    return i


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# --- tiny model ----------------------------------------------------------------------------
def build_tiny(folder: Path) -> None:
    """Write the tiny model + tokenizer into ``folder`` (which must exist and be empty)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = _save_tokenizer(folder)
    config = LlamaConfig(
        vocab_size=ids["vocab"],
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        **TINY_ARCH,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]  # transformers types .to() through a decorator that loses self
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"],
        eos_token_id=[ids["eos"], ids["eot"]],
        pad_token_id=ids["pad"],
    )
    model.save_pretrained(str(folder), safe_serialization=True)
    (folder / "README.md").write_text(
        "# pathprobe tiny model\n\nRandom weights (seed "
        f"{TINY_SEED}), Llama architecture, byte-level BPE tokenizer trained on a small embedded "
        "corpus. Written by `pathprobe make-model`; for latency measurement only.\n"
    )


def ensure_tiny(folder: Path | None = None) -> Path:
    """The tiny model's folder, built on first use (race-safe: built aside, then renamed)."""
    final = Path(folder) if folder is not None else tiny_dir()
    if _complete(final) and has_weights(final):
        return final
    if final.exists() and any(final.iterdir()):
        raise ConfigError(f"{final}: exists and is not a complete model folder; remove it or choose another --out")
    if final.exists():
        final.rmdir()
    return _build_in_temp(final, build_tiny)


# --- presets -------------------------------------------------------------------------------
def split_preset(name: str) -> tuple[str, str]:
    """``"NAME"`` -> (NAME, ""); ``"NAME@tiny"`` -> (NAME, "tiny")."""
    base, _, scale = name.partition("@")
    if base not in PRESETS:
        raise ConfigError(f"model: unknown preset {base!r}; known presets: {', '.join(sorted(PRESETS))}")
    if scale not in ("", TINY_SCALE):
        raise ConfigError(f"model: preset scale {scale!r} unknown; use preset:{base} or preset:{base}@{TINY_SCALE}")
    return base, scale


def preset_dir(name: str) -> Path:
    base, scale = split_preset(name)
    return cache_dir() / "presets" / f"{base}{'-' + scale if scale else ''}-v{PRESET_VERSION}"


def preset_config(name: str, vocab: int | None = None) -> dict[str, Any]:
    """The preset's config values; at test scale, shrunk with the same structure."""
    base, scale = split_preset(name)
    cfg = dict(PRESETS[base])
    if scale == TINY_SCALE:
        heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        cfg.update(TINY_OVERRIDES)
        cfg["num_key_value_heads"] = max(1, 4 * kv // heads)  # keep the grouped-KV ratio
        cfg.pop("head_dim", None)
        if "n_routed_experts" in cfg:
            cfg.update(TINY_MOE)
        if cfg.get("sliding_window"):
            cfg["sliding_window"] = 512
        if isinstance(cfg.get("rope_scaling"), dict) and "original_max_position_embeddings" in cfg["rope_scaling"]:
            cfg["rope_scaling"] = dict(cfg["rope_scaling"], original_max_position_embeddings=512)
        if "original_max_position_embeddings" in cfg:
            cfg["original_max_position_embeddings"] = cfg["max_position_embeddings"]
        if vocab is not None:
            cfg["vocab_size"] = vocab
    return cfg


def preset_tokenizer(name: str) -> TokenizerSpec | None:
    base, scale = split_preset(name)
    spec = PRESET_TOKENIZERS.get(base)
    if spec is not None and scale == TINY_SCALE:
        spec = spec.scaled(TINY_TOKENIZER_VOCAB[spec.kind])
    return spec


def build_preset(name: str, folder: Path) -> None:
    base, _scale = split_preset(name)
    spec = preset_tokenizer(name)
    ids = _save_tokenizer(folder, spec, max_len=int(PRESETS[base].get("max_position_embeddings", 2048)))
    cfg = preset_config(name, vocab=ids["vocab"])
    if ids["vocab"] > cfg["vocab_size"]:
        raise ConfigError(f"preset {name}: tokenizer has {ids['vocab']} tokens, the model only {cfg['vocab_size']}")
    cfg.update(
        {
            "bos_token_id": ids["bos"],
            "eos_token_id": ids["eos"],
            "pad_token_id": ids["pad"],
            "torch_dtype": "bfloat16",
            "pathprobe_preset": name,
            "pathprobe_tokenizer": {
                "kind": spec.kind,
                "vocab_size": spec.vocab_size,
                "pretok": spec.pretok,
                "imitates": spec.source,
            }
            if spec
            else "tiny",
            "pathprobe_note": "published architecture, random weights built at load time (no weights in this folder)",
        }
    )
    _write_json(folder / "config.json", cfg)
    _write_json(
        folder / "generation_config.json",
        {
            "bos_token_id": ids["bos"],
            "eos_token_id": [ids["eos"], ids["eot"]],
            "pad_token_id": ids["pad"],
        },
    )


def ensure_preset(name: str, folder: Path | None = None) -> Path:
    split_preset(name)
    final = Path(folder) if folder is not None else preset_dir(name)
    if _complete(final):
        return final
    if final.exists() and any(final.iterdir()):
        raise ConfigError(f"{final}: exists and is not a complete model folder; remove it or choose another --out")
    if final.exists():
        final.rmdir()
    return _build_in_temp(final, lambda tmp: build_preset(name, tmp))


# --- resolution ----------------------------------------------------------------------------
def resolve_model(spec: str) -> Path:
    """``"tiny"`` | ``"preset:NAME"`` | a local Hugging Face model folder -> its folder."""
    if not spec or spec == "tiny":
        return ensure_tiny()
    if spec.startswith("preset:"):
        return ensure_preset(spec.split(":", 1)[1])
    path = Path(spec).expanduser()
    if not path.exists():
        raise ConfigError(
            f"model: {spec!r} is not 'tiny', 'preset:NAME' or an existing folder (nothing is downloaded from a hub)"
        )
    if not path.is_dir():
        raise ConfigError(f"model: {spec!r} is a file; give a Hugging Face model folder")
    if not (path / "config.json").is_file():
        raise ConfigError(f"model: {spec!r} has no config.json; is it a Hugging Face model folder?")
    return path


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model spec resolved to its folder, once per server start (picklable: an engine in a
    process of its own gets the same value)."""

    spec: str  # as given: "tiny", "preset:NAME" or a folder
    folder: Path
    name: str  # the name served to clients
    #: when the resolution started (monotonic ms) and how long it took (a preset or the tiny
    #: model is built on first use): the engine books it as its ``model_folder`` startup phase
    started_ms: float = 0.0
    took_ms: float = 0.0

    @property
    def has_weights(self) -> bool:
        return has_weights(self.folder)


def resolve(spec: str, name: str | None = None) -> ResolvedModel:
    """Resolve ``spec`` (building the tiny model or a preset on first use); ``name``: the name
    served to clients (default: :func:`model_display_name`)."""
    from pathprobe.timing import now_ms

    start = now_ms()
    folder = resolve_model(spec)
    return ResolvedModel(spec, folder, name or model_display_name(spec, folder), start, now_ms() - start)


def _folder(model: str | ResolvedModel) -> Path:
    return model.folder if isinstance(model, ResolvedModel) else resolve_model(model)


def model_display_name(spec: str, folder: Path | None = None) -> str:
    """The name served to clients: 'tiny', the preset name, or the folder name."""
    if not spec or spec == "tiny":
        return "tiny"
    if spec.startswith("preset:"):
        return spec.split(":", 1)[1].replace("@", "-")
    return Path(folder or spec).expanduser().resolve().name


def tiny_tokenizer_dir() -> Path:
    return cache_dir() / f"tiny-v{TINY_VERSION}-tokenizer"


def _has_tokenizer_json(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file()


def _write_tokenizer_json(folder: Path) -> None:
    _train_tokenizer().save(str(folder / "tokenizer.json"))


def resolve_tokenizer(spec: str) -> Path:
    """The folder holding ``spec``'s tokenizer, built without torch or transformers.

    ``tiny``: the tiny model's folder when it is built, else a folder holding only its
    ``tokenizer.json`` (trained here with ``tokenizers``), so a load-generator install can cut
    exact prompts without the model. A preset: its own folder (config and the tokenizer of its
    kind and vocabulary size; no weights).
    """
    if not spec or spec == "tiny":
        if _has_tokenizer_json(tiny_dir()):
            return tiny_dir()
        final = tiny_tokenizer_dir()
        if _has_tokenizer_json(final):
            return final
        return _build_in_temp(final, _write_tokenizer_json, _has_tokenizer_json)
    return resolve_model(spec)


_TOKENIZERS: dict[str, PreTrainedTokenizerBase] = {}


def _built_here(folder: Path) -> bool:
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "pathprobe_preset" in cfg


def load_tokenizer(model: str | ResolvedModel = "tiny") -> PreTrainedTokenizerBase:
    """The model's tokenizer (cached per process); a spec is resolved first."""
    folder = _folder(model)
    key = str(folder.resolve())
    if key not in _TOKENIZERS:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        # folders written here carry a plain tokenizer.json: load it as is (AutoTokenizer would
        # pick the architecture's own class, which may add tokens the model does not have)
        cls = PreTrainedTokenizerFast if _built_here(folder) else AutoTokenizer
        try:
            tok = cls.from_pretrained(key, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model: cannot load a tokenizer from {folder}: {exc}") from exc
        _TOKENIZERS[key] = tok
    return _TOKENIZERS[key]


_SLOW: dict[str, SlowByteLevelBPE | SlowSentencePiece] = {}


def load_slow_tokenizer(model: str | ResolvedModel) -> SlowByteLevelBPE | SlowSentencePiece:
    """The model's slow (Python) encoder, for presets built with a study tokenizer."""
    from pathprobe.models import tokenizer_build

    folder = _folder(model)
    key = str(folder.resolve())
    if key not in _SLOW:
        _SLOW[key] = tokenizer_build.load_slow(folder)
    return _SLOW[key]


def folder_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file in a folder (relative name -> hex), for determinism checks."""
    out: dict[str, str] = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# --- CLI -----------------------------------------------------------------------------------
def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "make-model",
        help="write the embedded tiny model + tokenizer (or a preset's config), no hub download",
        description="Writes the tiny random-weight Llama model and its locally trained BPE tokenizer "
        "(deterministic), or with --preset a published architecture's config.json + tokenizer whose "
        "random weights the engine builds at load time. Prints the folder.",
    )
    p.add_argument("--out", type=Path, default=None, help="folder to write (default: the cache folder)")
    p.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help=f"one of: {', '.join(sorted(PRESETS))}; NAME@tiny for the same architecture at test scale",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.preset:
        path = ensure_preset(args.preset, args.out)
    else:
        path = ensure_tiny(args.out)
    print(path)
    return 0
