"""Fused projections (``--engine-option fuse=1``) on the real tiny model: one QKV and one gate/up
GEMM per layer, the same logits and greedy tokens as the unfused model, no graph break for
torch.compile; blocks that cannot share a weight stay as they are; the compile options parse."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch
from pathprobe.engineoptions import TransformersOptions
from pathprobe.errors import ConfigError
from pathprobe.server.engine.base import EngineConfig, GenParams
from pathprobe.server.engine.fuse import fuse_projections
from pathprobe.server.engine.hf import TransformersEngine

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time there was"]


def _engine(**options: str) -> TransformersEngine:
    eng = TransformersEngine(EngineConfig(max_batch_size=4, max_wait_ms=2.0, options=options))
    asyncio.run(eng.start())
    return eng


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[TransformersEngine, TransformersEngine]]:
    static = {"static_cache": "1", "static_max_len": "256"}
    plain, fused = _engine(**static), _engine(**static, fuse="1")
    yield plain, fused
    for eng in (plain, fused):
        asyncio.run(eng.stop())


def _greedy(eng: TransformersEngine) -> list[tuple[str, list[int]]]:
    async def go() -> list[tuple[str, list[int]]]:
        gens = [eng.generate(GenParams(prompt=p, max_tokens=24, ignore_eos=True)) for p in PROMPTS]
        return list(await asyncio.gather(*(g.collect() for g in gens)))

    return asyncio.run(go())


def test_fused_model_has_one_gemm_per_input_and_the_same_outputs(
    pair: tuple[TransformersEngine, TransformersEngine],
) -> None:
    plain, fused = pair
    note = {p.name: p.note for p in fused.startup.ordered()}["fuse"]
    layers = fused.model.config.num_hidden_layers
    assert note == f"fused QKV in {layers} attention blocks, gate/up in {layers} MLPs"
    attn, mlp = fused.model.model.layers[0].self_attn, fused.model.model.layers[0].mlp
    q, k, v = (getattr(plain.model.model.layers[0].self_attn, n).weight for n in ("q_proj", "k_proj", "v_proj"))
    assert torch.equal(attn.qkv_proj.weight, torch.cat([q, k, v]))
    assert (
        not hasattr(mlp, "gate_proj") and mlp.gate_up_proj.weight.shape[0] == 2 * fused.model.config.intermediate_size
    )
    # the same weights in fewer tensors: the parameter count is unchanged
    assert sum(p.numel() for p in fused.model.parameters()) == sum(p.numel() for p in plain.model.parameters())
    ids = torch.tensor([[5, 9, 33, 7, 100, 3, 41]])
    with torch.inference_mode():
        a, b = plain.model(input_ids=ids).logits, fused.model(input_ids=ids).logits
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    # through the engine (static KV cache, batched): the same greedy tokens
    assert _greedy(fused) == _greedy(plain)


def test_fused_decode_step_compiles_as_one_graph(pair: tuple[TransformersEngine, TransformersEngine]) -> None:
    _, fused = pair
    static = fused._static
    assert static is not None
    torch._dynamo.reset()
    with torch.inference_mode():
        explained = torch._dynamo.explain(static._forward)(1, 64)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_blocks_that_cannot_share_a_weight_are_left_alone() -> None:
    class Attn(torch.nn.Module):
        def __init__(self, k_in: int) -> None:
            super().__init__()
            self.q_proj, self.k_proj = torch.nn.Linear(8, 8), torch.nn.Linear(k_in, 4)
            self.v_proj, self.o_proj = torch.nn.Linear(8, 4), torch.nn.Linear(8, 8)

    model = torch.nn.Sequential(Attn(8), Attn(6))  # the second's k_proj reads another input size
    assert fuse_projections(model) == "fused QKV in 1 attention blocks, gate/up in 0 MLPs"
    assert hasattr(model[0], "qkv_proj") and type(model[1].q_proj) is torch.nn.Linear
    assert fuse_projections(model) == "fused QKV in 0 attention blocks, gate/up in 0 MLPs"  # idempotent


def test_compile_options_parse_and_name_the_key() -> None:
    opts = TransformersOptions.parse(
        {"compile": "1", "compile_mode": "max-autotune-no-cudagraphs", "compile_fullgraph": "1", "fuse": "on"}
    )
    assert opts.compile_mode == "max-autotune-no-cudagraphs" and opts.compile_fullgraph and opts.fuse
    assert "compile_mode=max-autotune-no-cudagraphs" in opts.items() and "fuse=1" in opts.items()
    with pytest.raises(ConfigError, match="compile_mode"):
        TransformersOptions.parse({"compile_mode": "reduce-overhead"})  # it would capture graphs itself
    with pytest.raises(ConfigError, match="compile_cache"):
        TransformersOptions.parse({"compile_cache": " "})
    with pytest.raises(ConfigError, match="fuse"):
        TransformersOptions.parse({"fuse": "maybe"})
