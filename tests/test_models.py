"""The embedded models: deterministic, loadable through the normal from_pretrained path."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import pytest
from pathprobe import models
from pathprobe.errors import ConfigError


def test_tiny_is_deterministic(tmp_path: Path) -> None:
    a = models.ensure_tiny(tmp_path / "a")
    b = models.ensure_tiny(tmp_path / "b")
    da, db = models.folder_digest(a), models.folder_digest(b)
    assert "model.safetensors" in da and "tokenizer.json" in da and "config.json" in da
    assert da == db


def test_tiny_reused_not_rebuilt(tmp_path: Path) -> None:
    a = models.ensure_tiny(tmp_path / "m")
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    assert models.ensure_tiny(tmp_path / "m") == a
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime


def _build(folder: str) -> str:
    return str(models.ensure_tiny(Path(folder)))


def test_two_processes_racing(tmp_path: Path) -> None:
    target = str(tmp_path / "race")
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        out = pool.map(_build, [target, target])
    assert out == [target, target]
    ref = models.folder_digest(models.ensure_tiny(tmp_path / "ref"))
    assert models.folder_digest(Path(target)) == ref
    # no temp folders left behind
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_tiny_loads_with_auto_classes(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = models.ensure_tiny(tmp_path / "t")
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    cfg = model.config
    assert cfg.model_type == "llama"
    assert cfg.hidden_size // cfg.num_attention_heads == 32  # a head size vLLM's CPU attention accepts
    assert 1000 <= len(tok) <= 2000 and cfg.vocab_size == len(tok)
    assert tok.bos_token and tok.eos_token
    ids = tok("The capital of France is").input_ids
    assert ids[0] == tok.bos_token_id and len(ids) < 12  # trained merges: words, not bytes
    assert tok.decode(ids, skip_special_tokens=True) == "The capital of France is"
    chat = tok.apply_chat_template([{"role": "user", "content": "Hello!"}], add_generation_prompt=True, tokenize=False)
    assert "Hello!" in chat and chat.endswith("assistant<|end_header_id|>\n\n")
    out = model.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)
    assert out.shape[1] == len(ids) + 5 or out[0, -1].item() in model.generation_config.eos_token_id


def test_cache_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATHPROBE_CACHE", str(tmp_path / "c"))
    assert models.cache_dir() == tmp_path / "c"
    assert models.resolve_model("tiny") == tmp_path / "c" / f"tiny-v{models.TINY_VERSION}"
    monkeypatch.delenv("PATHPROBE_CACHE")
    assert models.cache_dir() == Path.home() / ".cache" / "pathprobe"


def test_preset_writes_config_not_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATHPROBE_CACHE", str(tmp_path))
    folder = models.resolve_model("preset:llama-3-8b")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["hidden_size"] == 4096 and cfg["num_hidden_layers"] == 32 and cfg["vocab_size"] == 128256
    assert not models.has_weights(folder)
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(folder))
    assert c.num_key_value_heads == 8
    assert models.load_tokenizer("preset:llama-3-8b").eos_token == models.EOS
    assert models.model_display_name("preset:llama-3-8b") == "llama-3-8b"


def test_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown preset 'gpt-9'.*llama-3-8b"):
        models.resolve_model("preset:gpt-9")
    with pytest.raises(ConfigError, match="nothing is downloaded"):
        models.resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no config.json"):
        models.resolve_model(str(tmp_path))
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "junk").write_text("x")
    with pytest.raises(ConfigError, match="not a complete model folder"):
        models.ensure_tiny(tmp_path / "x")


def test_make_model_cli(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pathprobe", "make-model", "--out", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").is_file()
    out = subprocess.run(
        [sys.executable, "-m", "pathprobe", "make-model", "--preset", "qwen2.5-0.5b", "--out", str(tmp_path / "q")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads((tmp_path / "q" / "config.json").read_text())["model_type"] == "qwen2"
    bad = subprocess.run(
        [sys.executable, "-m", "pathprobe", "make-model", "--preset", "nope"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "unknown preset" in bad.stderr
