"""``pathprobe serve``'s configuration: one typed ServeConfig (flags > environment > defaults), one
default and one check per key, typed engine options, and the command line compare builds with
``ServeConfig.to_argv()`` parsed back to the same configuration."""

from __future__ import annotations

import dataclasses
import math

import pytest
from pathprobe import engineoptions
from pathprobe.analysis.lab.config import ServerConfig, parse_config
from pathprobe.analysis.lab.stack import serve_config
from pathprobe.cli import build_parser
from pathprobe.engineoptions import SyntheticOptions, TransformersOptions, VllmOptions
from pathprobe.errors import ConfigError
from pathprobe.serveconfig import DEFAULTS, ENV, ServeConfig
from pathprobe.server.cli import config_from_args
from pathprobe.server.engine.base import EngineConfig


def _parse(argv: list[str], environ: dict[str, str] | None = None) -> ServeConfig:
    return config_from_args(build_parser().parse_args(["serve", *argv]), environ or {})


def _serve_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb")
    return sub.choices["serve"]


# compare's server block with every key away from its default
SERVER_BLOCK = {
    "engine": "synthetic",
    "model": "preset:llama-3-8b@tiny",
    "max_batch_size": 3,
    "max_wait_ms": 0.25,
    "max_queue": 17,
    "prefill_ms_per_token": 0.05,
    "decode_ms_per_token": 1.5,
    "engine_process": True,
    "http_server": "fastapi",
}


def test_compare_config_to_argv_to_serve_config_round_trips_every_key() -> None:
    cfg = parse_config({"server": SERVER_BLOCK})
    s = cfg.server
    more = {k: getattr(s, k) for k in ("max_wait_ms", "max_queue", "prefill_ms_per_token", "decode_ms_per_token")}
    built = serve_config(
        s,
        s.engine,
        50123,
        8123,
        True,
        extra_http_server=(("aiohttp", 8124),),
        traces_file="/tmp/x/server.jsonl",
        **more,
    )
    argv = built.to_argv()
    back = _parse(argv)
    assert back == built, (argv, back, built)
    # every key of compare's server block that is a serve key arrives as itself
    for key, value in SERVER_BLOCK.items():
        assert getattr(back, key) == value, key
    assert (back.host, back.grpc_port, back.http_port) == ("127.0.0.1", 50123, 8123)
    assert back.extra_http_server == (("aiohttp", 8124),) and back.traces_file == "/tmp/x/server.jsonl"


def test_every_serve_key_round_trips_through_argv() -> None:
    """Every field away from its default, engine options included, comes back from to_argv()."""
    full = ServeConfig(
        engine="transformers",
        model="preset:qwen2-7b@tiny",
        model_name="m",
        host="127.0.0.2",
        grpc_port=0,
        http_port=1234,
        http_server="fastapi",
        extra_http_server=(("aiohttp", 1235), ("fastapi", 1236)),
        device="cpu",
        dtype="bfloat16",
        max_batch_size=2,
        max_wait_ms=0.5,
        max_queue=3,
        max_context=99,
        max_body_bytes=1000,
        prefill_ms_per_token=0.1,
        decode_ms_per_token=0.2,
        engine_options=TransformersOptions(
            threads=0,
            static_cache=True,
            static_max_len=128,
            static_wait_ms=5.0,
            cuda_graphs=True,
            compile=True,
            compile_mode="max-autotune-no-cudagraphs",
            compile_fullgraph=True,
            compile_tune=True,
            compile_cache="/tmp/inductor",
            fuse=True,
            batching="static",
            pad="fixed:64",
            prefill_max_len=32,
            prefill_max_batch=2,
            tokenizer="slow",
            experts="eager",
            prefix_cache=False,
            prefix_cache_mb=64.0,
            prefix_cache_entries=8,
            graph_warm=False,
            quant="int8",
            cudnn_sdp=True,
            gc_freeze=False,
        ),
        engine_process=True,
        traces_file="t.jsonl",
        api_key="k1,k2",
        drain_delay_s=1.5,
        drain_grace_s=2.5,
    )
    init = [f.name for f in dataclasses.fields(ServeConfig) if f.init]
    # TLS needs real files (spelled like the others); the engine is the one the options are for
    # (another engine round-trips in the compare test)
    skipped = {"tls_cert", "tls_key", "tls_ca", "engine"}
    assert all(getattr(full, k) != getattr(DEFAULTS, k) for k in init if k not in skipped), "a key left at default"
    opts = full.options
    assert all(getattr(opts, f.name) != f.default for f in dataclasses.fields(opts)), "an option left at default"
    assert _parse(full.to_argv()) == full
    assert _parse(DEFAULTS.to_argv()) == DEFAULTS
    # the environment's keys are spelled out, so a variable set around compare cannot change them
    assert {"--engine", "--model", "--http-server"} <= set(DEFAULTS.to_argv())


def test_each_serve_option_has_one_default() -> None:
    """The flags, the engine's config and compare's server block take serve's defaults."""
    flags = [a for a in _serve_parser()._actions if a.dest not in ("help", "func")]
    assert flags and all(a.default is None for a in flags), [(a.dest, a.default) for a in flags if a.default]
    for f in dataclasses.fields(EngineConfig):
        renamed = {"kind": "engine", "process": "engine_process", "options": None}
        key = renamed.get(f.name, f.name)
        if key is not None:
            assert f.default == getattr(DEFAULTS, key), f.name
    own = {"engine_process": "compare runs the engine apart by default (docs/compare.md)"}
    for name, field in ServerConfig.model_fields.items():
        if hasattr(DEFAULTS, name) and name not in own:
            assert field.default is None or field.default == getattr(DEFAULTS, name), name
    for cls in (TransformersOptions, SyntheticOptions):
        assert cls.parse({}) == cls()


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("max_batch_size", 0),
        ("max_queue", 0),
        ("max_wait_ms", -1.0),
        ("max_wait_ms", math.nan),
        ("decode_ms_per_token", -0.5),
        ("prefill_ms_per_token", math.inf),
    ],
)
def test_one_check_per_key_wherever_it_is_set(key: str, bad: float) -> None:
    """serve's flag, the engine's config and compare's config reject a bad value with the same words."""
    with pytest.raises(ConfigError) as serve_err:
        ServeConfig(**{key: bad})
    assert str(serve_err.value).startswith(f"--{key.replace('_', '-')}: ")
    words = str(serve_err.value).partition(": ")[2]
    with pytest.raises(ConfigError, match=f"--{key.replace('_', '-')}") as engine_err:
        EngineConfig(**{key: bad})
    assert str(engine_err.value) == str(serve_err.value)
    with pytest.raises(ConfigError, match=f"server.{key}") as compare_err:
        parse_config({"server": {key: bad}})
    assert words.split(",")[0] in str(compare_err.value)


def test_flags_over_environment_over_defaults() -> None:
    env = {ENV["engine"]: "synthetic", ENV["model"]: "preset:qwen2-7b@tiny", ENV["http_server"]: "fastapi"}
    assert (_parse([], env).engine, _parse([], env).model, _parse([], env).http_server) == (
        "synthetic",
        "preset:qwen2-7b@tiny",
        "fastapi",
    )
    assert _parse(["--engine", "vllm", "--http-server", "aiohttp"], env).engine == "vllm"
    assert _parse([], {ENV["engine"]: ""}).engine == DEFAULTS.engine  # empty counts as unset
    assert _parse([], {ENV["api_key"]: "a,b"}).api_keys == (b"a", b"b")
    with pytest.raises(ConfigError, match="--engine"):
        _parse([], {ENV["engine"]: "nope"})
    # --engine-option is read for the engine the environment picks when --engine is not given
    with pytest.raises(ConfigError, match="--engine-option threads: unknown for the synthetic engine"):
        _parse(["--engine-option", "threads=2"], env)


def test_engine_options_are_typed_and_bad_ones_name_their_key() -> None:
    opts = engineoptions.parse("transformers", ["threads=2", "cuda_graphs=on", "pad=BUCKET", "batching=dynamic"])
    assert opts == TransformersOptions(threads=2, cuda_graphs=True, pad="bucket", batching="dynamic")
    assert engineoptions.parse("vllm", ["max_model_len=512"]) == VllmOptions((("max_model_len", "512"),))
    for items, words in (
        (["cuda_graph=1"], "--engine-option cuda_graph: unknown for the transformers engine"),
        (["threads=two"], "--engine-option threads: expected a whole number"),
        (["threads=-1"], "--engine-option threads: must be at least 0"),
        (["static_cache=maybe"], "--engine-option static_cache: expected 1/0"),
        (["static_wait_ms=nan"], "--engine-option static_wait_ms: must be a finite number"),
        (["batching=greedy"], "--engine-option batching: expected one of continuous, dynamic, static"),
        (["pad=fixed:x"], "--engine-option pad: expected longest, bucket or fixed:N"),
        (["tokenizer=medium"], "--engine-option tokenizer: expected one of fast, slow"),
        (["prefill_max_batch=0"], "--engine-option prefill_max_batch: must be at least 1"),
        (["novalue"], "--engine-option: expected KEY=VALUE"),
    ):
        with pytest.raises(ConfigError) as err:
            engineoptions.parse("transformers", items)
        assert str(err.value).startswith(words), (items, str(err.value))
    with pytest.raises(ConfigError, match="--engine-option threads: unknown for the synthetic engine"):
        engineoptions.parse("synthetic", {"threads": "2"})
    # what an engine is given in code (a mapping) is parsed and checked the same way
    assert EngineConfig(options={"static_cache": "1"}).options == TransformersOptions(static_cache=True)
    with pytest.raises(ConfigError, match="--engine-option pad"):
        EngineConfig(options={"pad": "fixed:0"})
