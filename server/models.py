"""Models pathprobe serves without downloading anything.

- ``tiny``: a small random-weight Llama-architecture model (head size 32, so vLLM's CPU
  attention accepts it too) and a byte-level BPE tokenizer trained here, on a corpus
  embedded in this module. Built deterministically, once, in the cache folder
  (``$PATHPROBE_CACHE``, else ``~/.cache/pathprobe``); same bytes on the same library
  versions.
- ``preset:NAME``: a real architecture (Llama-3-8B, Qwen2-7B, …) written as a
  ``config.json`` with the published values plus the tiny tokenizer, and no weights:
  the engine builds the model with random weights at load time (``from_config``).
- a path: any local Hugging Face model folder.

Heavy libraries (torch, transformers, tokenizers) are imported inside functions only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pathprobe import environment
from pathprobe.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerBase

#: Bump when the tiny model's recipe changes (the cache folder name carries it).
TINY_VERSION = 1
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

# Published configuration values (from each model's config.json), typed in here so
# nothing is fetched. Token ids are replaced by the tiny tokenizer's.
PRESETS: dict[str, dict[str, Any]] = {
    "llama-3-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
        "mlp_bias": False,
    },
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "hidden_act": "silu", "tie_word_embeddings": False,
    },
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": True,
    },
    "qwen2-7b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "tie_word_embeddings": False, "use_sliding_window": False,
        "sliding_window": None,
    },
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "tie_word_embeddings": True, "use_sliding_window": False,
        "sliding_window": None,
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "tie_word_embeddings": False, "use_sliding_window": False,
        "sliding_window": None,
    },
    # Mistral-7B-v0.3 (no sliding window; 32768-token vocabulary).
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "vocab_size": 32768, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
        "sliding_window": None,
    },
}

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")

# The tokenizer's training text. Plain English on everyday and technical subjects, so
# the vocabulary holds common words and prompts tokenize into sensible pieces.
CORPUS = """\
The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.
The capital of Spain is Madrid, and the capital of Japan is Tokyo. London is the capital of the
United Kingdom. Each city has a long history, busy streets, museums, parks and a river or a port.

A request leaves the client, crosses the network, reaches a gateway, and is forwarded to the model
server. The server parses the request, places it in a queue, and the engine schedules it into a
batch. The engine turns the prompt into tokens, runs the prefill, then produces one token at a time
until it reaches the end of the text or the maximum number of tokens. Every step takes time: the
network, the serialization of the message, the time spent waiting in the queue, and the inference
itself. To find where the milliseconds go, measure each part with a monotonic clock and report the
durations, never the absolute times, because the clocks of two machines never agree exactly.

Latency is the time between a question and its answer. Throughput is the number of answers per
second. When more users arrive than the server can handle, requests wait in the queue and latency
grows, even though the work for each request stays the same. A good benchmark separates warm-up
from measurement, runs several rounds, and reports percentiles with confidence intervals.

Once upon a time there was a small village at the edge of a large forest. The people of the village
grew wheat and apples, kept bees, and baked bread every morning. In the winter the snow covered the
roofs and the children played on the frozen lake. In the spring the birds came back, the trees were
green again, and the farmers went out to the fields before the sun was up.

To make a simple soup, cut two onions, three carrots and a few potatoes into small pieces. Warm some
oil in a pot, cook the onions until they are soft, add the other vegetables and cover them with
water. Add salt and pepper, let it boil gently for half an hour, and serve it hot with fresh bread.

The weather today is cloudy with a chance of rain in the afternoon. Tomorrow will be sunny and warm,
with light wind from the west. Temperatures will reach twenty degrees in the city and a little less
near the coast. At night the sky will clear and it will be cold in the valleys.

Hello! How are you today? I am fine, thank you. What would you like to do this weekend? We could go
for a walk in the park, visit the new museum, or watch a film at home. Let me know what you think,
and please tell me if you need anything from the shop on the way back.

Water boils at one hundred degrees Celsius at sea level. The Earth turns around the Sun once a year
and around its own axis once a day. Light travels about three hundred thousand kilometres per
second. A computer stores numbers as bits, and a byte holds eight bits. Memory is fast, disks are
slower, and the network is slower still, so good programs keep the data close to where it is used.

Question: What is two plus two? Answer: Two plus two is four.
Question: What colour is the sky on a clear day? Answer: The sky is blue.
Question: Who wrote the letter? Answer: The letter was written by my grandmother in nineteen fifty.
Question: Where is the station? Answer: The station is at the end of this street, next to the bank.

The system administrator opened a terminal, checked the logs, and found that the service had
restarted three times during the night. The error said that the connection was refused by the
upstream host. After a short investigation she found a wrong port number in the configuration file,
fixed it, deployed the new version, and watched the graphs until the error rate went back to zero.

def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, 1))

{"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0.0, "stream": true}

Numbers and dates: 0 1 2 3 4 5 6 7 8 9 10 12 16 32 64 100 128 256 512 1000 1024 2048 4096 8192.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday. January, February, March, April,
May, June, July, August, September, October, November and December.

Good stories have a beginning, a middle and an end. The hero leaves home, meets a friend, faces a
problem that seems too big, learns something new, and comes back changed. Readers like characters
who want something and who have to work for it. Short sentences keep the pace. Long sentences, with
many clauses and a slow rhythm, give the reader time to look around and to feel the place.

Science asks questions and tests answers against the world. An experiment changes one thing at a
time and measures what happens. If the result surprises you, repeat it, check the instruments, and
ask a colleague to look at the method. Write down what you did so that someone else can do it again.
"""


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


def _publish(tmp: Path, final: Path) -> None:
    """Move a fully built folder into place; if another process won the race, keep theirs."""
    try:
        os.replace(tmp, final)
    except OSError:
        if not _complete(final):
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _build_in_temp(final: Path, build) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        tmp.chmod(0o755)
        build(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _publish(tmp, final)
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
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, bos_id)]
        ),
    ])
    return tok


def _save_tokenizer(folder: Path) -> dict[str, int]:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=TINY_ARCH["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    tok.padding_side = "left"
    tok.save_pretrained(str(folder))
    return {
        "vocab": len(tok),
        "bos": tok.convert_tokens_to_ids(BOS),
        "eos": tok.convert_tokens_to_ids(EOS),
        "pad": tok.convert_tokens_to_ids(PAD),
        "eot": tok.convert_tokens_to_ids(EOT),
    }


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
        model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=[ids["eos"], ids["eot"]], pad_token_id=ids["pad"],
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
def preset_dir(name: str) -> Path:
    return cache_dir() / "presets" / f"{name}-v{TINY_VERSION}"


def build_preset(name: str, folder: Path) -> None:
    ids = _save_tokenizer(folder)
    cfg = dict(PRESETS[name])
    cfg.update({
        "bos_token_id": ids["bos"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
        "torch_dtype": "bfloat16",
        "pathprobe_preset": name,
        "pathprobe_note": "published architecture, random weights built at load time (no weights in this folder)",
    })
    _write_json(folder / "config.json", cfg)
    _write_json(folder / "generation_config.json", {
        "bos_token_id": ids["bos"], "eos_token_id": [ids["eos"], ids["eot"]], "pad_token_id": ids["pad"],
    })


def ensure_preset(name: str, folder: Path | None = None) -> Path:
    if name not in PRESETS:
        raise ConfigError(f"model: unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
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


def model_display_name(spec: str, folder: Path | None = None) -> str:
    """The name served to clients: 'tiny', the preset name, or the folder name."""
    if not spec or spec == "tiny":
        return "tiny"
    if spec.startswith("preset:"):
        return spec.split(":", 1)[1]
    return Path(folder or spec).expanduser().resolve().name


_TOKENIZERS: dict[str, Any] = {}


def load_tokenizer(spec: str = "tiny") -> PreTrainedTokenizerBase:
    """The model's tokenizer (cached per process)."""
    folder = resolve_model(spec)
    key = str(folder.resolve())
    if key not in _TOKENIZERS:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(key, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model: cannot load a tokenizer from {folder}: {exc}") from exc
        _TOKENIZERS[key] = tok
    return _TOKENIZERS[key]


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
    p.add_argument("--preset", default=None, metavar="NAME", help=f"one of: {', '.join(sorted(PRESETS))}")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.preset:
        path = ensure_preset(args.preset, args.out)
    else:
        path = ensure_tiny(args.out)
    print(path)
    return 0
