"""The latency study's seven presets at test scale: same architecture classes, tokenizers of
the same kind (slow and fast giving the same ids), served end to end, with startup attribution
and "no GPU" telemetry on this CPU box."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pathprobe import gputelemetry, models
from pathprobe.errors import ConfigError
from pathprobe.models import presets, tokenizer_build
from pathprobe.server.startup import PHASES, StartupTimer

from tests.support.clients import grpc_generate, http_post
from tests.support.procs import Server

TEXT = "The capital of France is Paris. It has 2148271 people; naïve café, tabs\tand  two spaces.\n"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("presets")


def _spec(name: str) -> str:
    return f"preset:{name}@tiny"


@pytest.mark.parametrize("name", presets.STUDY_PRESETS)
def test_study_preset_builds_and_runs(name: str, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    monkeypatch.setenv("PATHPROBE_CACHE", str(cache))
    folder = models.resolve_model(_spec(name))
    cfg = json.loads((folder / "config.json").read_text())
    full = presets.PRESETS[name]
    assert cfg["model_type"] == full["model_type"] and cfg["architectures"] == full["architectures"]
    tok_spec = presets.PRESET_TOKENIZERS[name]
    assert cfg["pathprobe_tokenizer"]["kind"] == tok_spec.kind
    tok = models.load_tokenizer(_spec(name))
    slow = models.load_slow_tokenizer(_spec(name))
    ids = tok.encode(TEXT)
    assert slow.encode(TEXT, bos=tok.bos_token_id) == ids  # the slow path is the same tokenizer
    assert tok.decode(ids, skip_special_tokens=True) == TEXT
    assert len(tok) == cfg["vocab_size"] and max(ids) < cfg["vocab_size"]
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)))
    if "n_routed_experts" in full:  # MoE routing kept at test scale
        assert cfg["n_routed_experts"] > cfg["num_experts_per_tok"] > 1
        assert any("experts" in n for n, _ in model.named_modules())
    logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), cfg["vocab_size"]) and torch.isfinite(logits).all()


def test_full_scale_configs_keep_published_sizes() -> None:
    for name in presets.STUDY_PRESETS:
        cfg, spec = models.preset_config(name), models.preset_tokenizer(name)
        assert spec is not None and spec.vocab_size + len(models.SPECIAL_TOKENS) <= cfg["vocab_size"], name
    assert models.preset_tokenizer("phi-3-mini").kind == "sentencepiece"
    assert models.preset_tokenizer("llama-3-8b-instruct").vocab_size == 128000
    assert models.preset_config("deepseek-v2-lite")["n_routed_experts"] == 64
    with pytest.raises(ConfigError, match="scale 'huge'"):
        models.split_preset("olmo-1b@huge")


def test_tokenizer_trains_to_the_asked_vocabulary(tmp_path: Path) -> None:
    spec = tokenizer_build.TokenizerSpec("bpe", 3000, "cl100k")
    tok = tokenizer_build.build(spec, tmp_path, models.CORPUS, models.SPECIAL_TOKENS)
    assert tok.get_vocab_size() == 3000 + len(models.SPECIAL_TOKENS)


def test_startup_timer_table_and_phases() -> None:
    t = StartupTimer()
    with t.phase("tokenizer"):
        pass
    t.record("weights_init", t.t0, 12.5, "random init")
    with pytest.raises(ValueError):
        t.record("nope", 0, 1)
    assert list(t.as_dict()) == ["tokenizer", "weights_init"]  # table order, not call order
    assert t.as_dict()["weights_init"] == 12.5


def test_gpu_telemetry_says_no_gpu_here() -> None:
    s = gputelemetry.GpuSampler(interval_s=0.01).start()
    out = s.stop()
    assert out["gpu"] is False and out["reason"].startswith("no GPU")


def test_gpu_summary_flags_throttling() -> None:
    S = gputelemetry.Sample
    calm = [S(0.0, 40, 1980, 300, 1000, 0), S(0.2, 41, 1980, 310, 1000, 0x1)]
    assert (
        gputelemetry.summarize(calm)["throttled"] is False
        and gputelemetry.warning(gputelemetry.summarize(calm)) is None
    )
    hot = [*calm, S(0.4, 88, 1500, 700, 1000, 0x20 | 0x4)]
    out = gputelemetry.summarize(hot)
    assert out["throttled"] and out["sm_clock_mhz"]["min"] == 1500
    assert set(out["reasons_seen"]) == {"gpu_idle", "sw_power_cap", "sw_thermal_slowdown"}
    assert "throttled" in gputelemetry.warning(out) and abs(out["throttled_share"] - 1 / 3) < 1e-9


@pytest.mark.slow
def test_serve_reports_startup_and_serves_a_study_preset(tmp_path: Path, cache: Path) -> None:
    """A MoE preset (routing on the CPU) served with the slow tokenizer: startup table on stdout,
    gauges in /metrics (first_request once one ran), the same text as the fast tokenizer."""
    env = {"PATHPROBE_CACHE": str(cache)}
    models_env = ["--model", _spec("deepseek-v2-lite"), "--device", "cpu"]
    slow = Server(tmp_path, *models_env, "--engine-option", "tokenizer=slow", env=env)
    try:
        status, _, body = http_post(
            f"{slow.http_url}/v1/generate", {"prompt": "The capital of France is", "max_tokens": 4, "ignore_eos": True}
        )
        assert status == 200
        resp, entries = grpc_generate(
            slow.grpc_target, prompt="The capital of France is", max_tokens=4, ignore_eos=True
        )
        assert resp.text == json.loads(body)["text"] and entries["srv.tokenize"] > 0
        with __import__("urllib.request").request.urlopen(f"{slow.http_url}/metrics", timeout=10) as r:
            metrics = r.read().decode()
    finally:
        slow.stop()
    log = slow.log()
    table = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+)\s+([\d.]+)\s", log, re.M)}
    for phase in (
        "imports",
        "model_folder",
        "tokenizer",
        "tokenizer_slow",
        "weights_init",
        "warmup",
        "frontends",
        "first_request",
    ):
        assert phase in table, (phase, log)
    assert "weights_read" not in table  # a preset has no weight files: not shown as zero
    gauges = dict(re.findall(r'pathprobe_server_startup_ms\{phase="(\w+)"\} ([\d.e+-]+)', metrics))
    assert set(gauges) >= {"total", "tokenizer", "weights_init", "warmup", "first_request"}
    assert float(gauges["total"]) >= float(gauges["weights_init"]) > 0
    assert "pathprobe_gpu_" not in metrics  # no GPU here: no GPU gauges
    assert set(PHASES) >= set(table) - {"total"}


def _engine(**options):
    import asyncio

    from pathprobe.server.engine.base import EngineConfig
    from pathprobe.server.engine.hf import TransformersEngine

    eng = TransformersEngine(EngineConfig(device="cpu", max_batch_size=4, max_wait_ms=1.0, options=options))
    asyncio.run(eng.start())
    return eng


def _burst(eng, prompts: list[str], tokens: list[int]):
    """The first request starts alone; the others arrive once it has produced a token."""
    import asyncio

    from pathprobe.server.engine.base import GenParams

    async def go():
        first = eng.generate(GenParams(prompt=prompts[0], max_tokens=tokens[0], ignore_eos=True))
        it = first.__aiter__()
        head = await it.__anext__()
        late = [
            eng.generate(GenParams(prompt=p, max_tokens=n, ignore_eos=True)) for p, n in zip(prompts[1:], tokens[1:])
        ]
        rest = [ev async for ev in it]
        ids = [[t for ev in [head, *rest] for t in ev.token_ids]] + [(await g.collect())[1] for g in late]
        return ids, [first, *late]

    return asyncio.run(go())


def test_batching_and_padding_modes_same_tokens_different_admission() -> None:
    """Ground truth: every mode yields the same greedy tokens; only continuous batching
    lets a late request join a running batch (dynamic makes it wait for the batch's end)."""
    import asyncio

    prompts = ["The capital of France is", "Hello! How are you today? I am fine, thank you.", "Water boils at"]
    tokens = [40, 6, 6]
    runs = {}
    for opts in ({}, {"batching": "dynamic"}, {"pad": "bucket"}, {"pad": "fixed:64"}):
        eng = _engine(**opts)
        try:
            runs[json.dumps(opts)] = _burst(eng, prompts, tokens)
        finally:
            asyncio.run(eng.stop())
    ref_ids = runs["{}"][0]
    for key, (ids, _) in runs.items():
        assert ids == ref_ids, key
    cont, dyn = runs["{}"][1], runs[json.dumps({"batching": "dynamic"})][1]
    # continuous: the late arrivals ran beside the long request; dynamic: they queued behind it
    assert max(g.timing.batch_size for g in cont[1:]) >= 2

    def end(g):  # when the long request's last decode step ended
        return g.timing.decode_start + g.timing.decode_steps

    assert all(g.timing.prefill_start >= end(dyn[0]) for g in dyn[1:])
    assert all(g.timing.prefill_start < end(cont[0]) for g in cont[1:])


def test_engine_options_are_checked() -> None:
    from pathprobe.server.engine.base import EngineConfig
    from pathprobe.server.engine.hf import TransformersEngine

    for opts, msg in (
        ({"batching": "greedy"}, "batching"),
        ({"pad": "fixed:x"}, "pad"),
        ({"tokenizer": "medium"}, "tokenizer"),
    ):
        with pytest.raises(ConfigError, match=msg):
            TransformersEngine(EngineConfig(device="cpu", options=opts))


def test_compare_reads_startup_gauges_from_metrics_page() -> None:
    """compare reads the server's startup phases from the real /metrics rendering."""
    from pathprobe.analysis.lab.probes import parse_startup
    from pathprobe.server.engine.base import EngineConfig
    from pathprobe.server.engine.synthetic import SyntheticEngine
    from pathprobe.server.metrics import ServerMetrics

    m = ServerMetrics(SyntheticEngine(EngineConfig(kind="synthetic")))
    m.set_startup_phases({"total": 1234.5, "weights_init": 800.25, "first_request": 12.0})
    assert parse_startup(m.render().decode()) == {"total": 1234.5, "weights_init": 800.25, "first_request": 12.0}


def test_engine_startup_splits_weight_read_from_init_for_a_folder_with_weights() -> None:
    """The tiny model has weight files: read (bytes from disk), init (from_pretrained) and
    device transfer are separate phases; a preset's folder has none, so no read phase."""
    import asyncio

    eng = _engine()
    try:
        phases = eng.startup.phases
        assert {
            "imports",
            "model_folder",
            "tokenizer",
            "weights_read",
            "weights_init",
            "device_transfer",
            "warmup",
        } <= set(phases)
        assert "MB in 1 file" in phases["weights_read"].note and phases["weights_init"].ms > 0
        assert "cuda_graphs" not in phases and "tokenizer_slow" not in phases  # not configured: absent, not zero
    finally:
        asyncio.run(eng.stop())
