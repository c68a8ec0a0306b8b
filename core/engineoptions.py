"""``pathprobe serve --engine-option KEY=VALUE``: one typed, frozen option class per engine.

An engine's known keys are its class's fields, so the command line, ``compare`` (which spells
them back with :meth:`items`) and the engine read the same list. A key the engine does not
know, or a value of the wrong kind, is a :class:`~pathprobe.errors.ConfigError` naming the key
(``--engine-option KEY: ...``), raised before anything starts. vLLM's keys are vLLM's own
engine arguments: passed on, not checked here. No heavy import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import ClassVar, Literal, Union, get_args

from pathprobe.errors import ConfigError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

#: a raw option value: a string from the command line, or a typed value from code
Raw = str | int | float | bool


def _err(key: str, msg: str) -> ConfigError:
    return ConfigError(f"--engine-option {key}: {msg}")


def _bool(key: str, value: Raw) -> bool:
    if isinstance(value, bool):
        return value
    low = str(value).strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise _err(key, f"expected 1/0 (true/false, yes/no, on/off), got {value!r}")


def _int(key: str, value: Raw, low: int) -> int:
    try:
        n = int(value) if not isinstance(value, float) else int(str(value))
    except (TypeError, ValueError):
        raise _err(key, f"expected a whole number, got {value!r}") from None
    if n < low:
        raise _err(key, f"must be at least {low}, got {n}")
    return n


def _float(key: str, value: Raw) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise _err(key, f"expected a number, got {value!r}") from None
    if not x >= 0 or math.isinf(x):  # also rejects nan
        raise _err(key, f"must be a finite number >= 0, got {value!r}")
    return x


def _positive(key: str, value: Raw) -> float:
    x = _float(key, value)
    if x <= 0:
        raise _err(key, f"must be > 0, got {value!r}")
    return x


def _choice(key: str, value: Raw, allowed: tuple[str, ...]) -> str:
    low = str(value).strip().lower()
    if low not in allowed:
        raise _err(key, f"expected one of {', '.join(allowed)}, got {value!r}")
    return low


def padding(value: str) -> tuple[str, int]:
    """``pad=longest`` (default) | ``bucket`` (next power of two) | ``fixed:N`` -> (mode, N)."""
    mode, _, n = value.strip().lower().partition(":")
    if mode in ("longest", "bucket") and not n:
        return mode, 0
    if mode == "fixed":
        try:
            size = int(n)
        except ValueError:
            size = 0
        if size > 0:
            return mode, size
    raise _err("pad", f"expected longest, bucket or fixed:N (N > 0), got {value!r}")


#: ``batching=``: continuous (join between steps), dynamic (a batch forms in the max_wait_ms
#: window, then runs to its end), static (waits up to static_wait_ms for a full batch)
BATCHING = ("continuous", "dynamic", "static")
TOKENIZERS = ("fast", "slow")
#: ``quant=``: weight-only quantization (torchao)
QUANT = ("none", "int8", "int4")
#: ``compile_mode=``: torch.compile's mode for the decode step (the engine captures its own CUDA graphs,
#: so none of the modes that capture graphs themselves)
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
#: the prefix cache's default bounds
PREFIX_CACHE_MB = 512.0
PREFIX_CACHE_ENTRIES = 64


@dataclass(frozen=True, slots=True)
class TransformersOptions:
    """The transformers engine's ``--engine-option`` keys."""

    engine: ClassVar[str] = "transformers"

    #: torch intra-op threads; unset: 1 on the CPU (see the engine), torch's own on CUDA; 0: torch's own
    threads: int | None = None
    #: a preallocated KV cache (shapes that never change); cuda_graphs implies it
    static_cache: bool = False
    #: its length in tokens (default: the model's context, at most 2048)
    static_max_len: int | None = None
    #: batching=static: how long a batch waits to fill
    static_wait_ms: float = 1000.0
    #: capture decode (and prefill) steps as CUDA graphs (CUDA only)
    cuda_graphs: bool = False
    #: torch.compile the static decode step
    compile: bool = False
    #: its torch.compile mode: default or max-autotune-no-cudagraphs (the engine captures the graphs)
    compile_mode: Literal["default", "max-autotune-no-cudagraphs"] = "default"
    #: compile the whole forward as one graph (fullgraph=True: a graph break is an error at start-up)
    compile_fullgraph: bool = False
    #: inductor's coordinate-descent tuning of the generated kernels (longer compile)
    compile_tune: bool = False
    #: a folder for inductor's and triton's caches kept across starts (default: inductor's own)
    compile_cache: str | None = None
    #: fuse each attention block's QKV and each MLP's gate/up projections into one GEMM at load
    fuse: bool = False
    batching: Literal["continuous", "dynamic", "static"] = "continuous"
    #: a batched prefill's width: longest, bucket (next power of two) or fixed:N
    pad: str = "longest"
    #: static prefill: prompts up to this many tokens (default 512 with cuda_graphs, else 0: off)
    prefill_max_len: int | None = None
    #: static prefill: at most this many newcomers at once (more take one batched eager prefill)
    prefill_max_batch: int = 4
    #: the prompt encoder: fast (tokenizers) or slow (the Python encoder of a study preset)
    tokenizer: Literal["fast", "slow"] = "fast"
    #: transformers' ``experts_implementation`` for MoE models
    experts: str | None = None
    #: prefix caching (dynamic KV cache only), bounded in MB and entries
    prefix_cache: bool = True
    prefix_cache_mb: float = PREFIX_CACHE_MB
    prefix_cache_entries: int = PREFIX_CACHE_ENTRIES
    #: replay every captured graph once at start-up (a graph's first launch is slower)
    graph_warm: bool = True
    #: weight-only quantization: none, int8 or int4 (torchao)
    quant: Literal["none", "int8", "int4"] = "none"
    #: torch's cuDNN attention backend (off by default on CUDA)
    cudnn_sdp: bool = False
    #: after start-up, gc.freeze() every object made so far
    gc_freeze: bool = True

    @classmethod
    def parse(cls, raw: Mapping[str, Raw]) -> TransformersOptions:
        _known(cls, raw)
        r = raw.get
        static_max_len, prefill_max_len, threads = r("static_max_len"), r("prefill_max_len"), r("threads")
        experts, compile_cache = r("experts"), r("compile_cache")
        return cls(
            threads=None if threads is None else _int("threads", threads, 0),
            static_cache=_bool("static_cache", r("static_cache", False)),
            static_max_len=None if static_max_len is None else _int("static_max_len", static_max_len, 1),
            static_wait_ms=_float("static_wait_ms", r("static_wait_ms", 1000.0)),
            cuda_graphs=_bool("cuda_graphs", r("cuda_graphs", False)),
            compile=_bool("compile", r("compile", False)),
            compile_mode=_choice("compile_mode", r("compile_mode", "default"), COMPILE_MODES),  # type: ignore[arg-type]
            compile_fullgraph=_bool("compile_fullgraph", r("compile_fullgraph", False)),
            compile_tune=_bool("compile_tune", r("compile_tune", False)),
            compile_cache=None if compile_cache is None else _folder("compile_cache", compile_cache),
            fuse=_bool("fuse", r("fuse", False)),
            batching=_choice("batching", r("batching", "continuous"), BATCHING),  # type: ignore[arg-type]
            pad=_pad(r("pad", "longest")),
            prefill_max_len=None if prefill_max_len is None else _int("prefill_max_len", prefill_max_len, 0),
            prefill_max_batch=_int("prefill_max_batch", r("prefill_max_batch", 4), 1),
            tokenizer=_choice("tokenizer", r("tokenizer", "fast"), TOKENIZERS),  # type: ignore[arg-type]
            experts=None if experts is None else str(experts),
            prefix_cache=_bool("prefix_cache", r("prefix_cache", True)),
            prefix_cache_mb=_positive("prefix_cache_mb", r("prefix_cache_mb", PREFIX_CACHE_MB)),
            prefix_cache_entries=_int("prefix_cache_entries", r("prefix_cache_entries", PREFIX_CACHE_ENTRIES), 1),
            graph_warm=_bool("graph_warm", r("graph_warm", True)),
            quant=_choice("quant", r("quant", "none"), QUANT),  # type: ignore[arg-type]
            cudnn_sdp=_bool("cudnn_sdp", r("cudnn_sdp", False)),
            gc_freeze=_bool("gc_freeze", r("gc_freeze", True)),
        )

    def items(self) -> list[str]:
        return _items(self)


def _folder(key: str, value: Raw) -> str:
    text = str(value).strip()
    if not text:
        raise _err(key, "expected a folder path, got an empty value")
    return text


def _pad(value: Raw) -> str:
    padding(str(value))
    return str(value).strip().lower()


@dataclass(frozen=True, slots=True)
class SyntheticOptions:
    """The synthetic engine reads no ``--engine-option`` (its times are flags of their own)."""

    engine: ClassVar[str] = "synthetic"

    @classmethod
    def parse(cls, raw: Mapping[str, Raw]) -> SyntheticOptions:
        _known(cls, raw)
        return cls()

    def items(self) -> list[str]:
        return []


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """vLLM's own engine arguments (``max_model_len=512``, ...), passed on to vLLM unchecked."""

    engine: ClassVar[str] = "vllm"

    values: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, raw: Mapping[str, Raw]) -> VllmOptions:
        return cls(tuple((k, str(v)) for k, v in raw.items()))

    def as_dict(self) -> dict[str, str]:
        return dict(self.values)

    def items(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.values]


EngineOptions = Union[TransformersOptions, SyntheticOptions, VllmOptions]  # noqa: UP007 (a runtime value)
#: engine -> its option class
OPTIONS: dict[str, type[EngineOptions]] = {c.engine: c for c in get_args(EngineOptions)}


def _known(cls: type[TransformersOptions | SyntheticOptions], raw: Mapping[str, Raw]) -> None:
    known = [f.name for f in fields(cls)]
    for key in raw:
        if key not in known:
            raise _err(key, f"unknown for the {cls.engine} engine (known: {', '.join(sorted(known)) or 'none'})")


def _items(options: TransformersOptions) -> list[str]:
    """``KEY=VALUE`` for every key that is not at its default (booleans as 1)."""
    out = []
    for f in fields(options):
        value = getattr(options, f.name)
        if value != f.default:
            out.append(f"{f.name}={int(value) if isinstance(value, bool) else value}")
    return out


def split_items(items: Iterable[str]) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` -> {KEY: VALUE} (a later KEY wins, as on the command line)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--engine-option: expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def parse(engine: str, raw: Mapping[str, Raw] | Iterable[str] | EngineOptions | None) -> EngineOptions:
    """The typed options of ``engine`` from ``KEY=VALUE`` items, a mapping, or typed options."""
    cls = OPTIONS.get(engine)
    if cls is None:
        raise ConfigError(f"--engine: unknown engine {engine!r} ({', '.join(OPTIONS)})")
    if isinstance(raw, cls):
        return raw
    if isinstance(raw, TransformersOptions | SyntheticOptions | VllmOptions):
        raise ConfigError(f"--engine-option: {type(raw).__name__} given for the {engine} engine")
    if raw is None:
        return cls()
    mapping = raw if isinstance(raw, Mapping) else split_items(raw)
    return cls.parse(mapping)
