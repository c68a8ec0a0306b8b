"""The GPU engine's second pass, in-process probes (the engine without the server around it).

    PYTHONPATH=... python3 bench/gpu_second_pass.py ttft --out FILE [--graph-warm 0|1]
    PYTHONPATH=... python3 bench/gpu_second_pass.py quant --out FILE

- ``ttft``: the CUDA-graph engine (Llama-3-8B shape, batch 32) from its start: 5 single requests,
  the study's 32-stream warm-up, then 20 single requests (64-token prompt, 64 new tokens), each with
  its server-side TTFT (queue + prefill) and which prefill ran (``EngineTiming.prefill_path``);
  then the first and later replays of prefill graphs no request has used yet.
- ``quant``: bf16 against torchao weight-only int8 / int4 on the same random weights (seed 0):
  parameter memory, and the top-1 agreement of greedy tokens (teacher-forced over bf16's greedy
  continuations, and the first position where free-running greedy output differs). Random weights
  allow no other quality signal.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pathprobe.server.engine.base import EngineConfig, GenParams
from pathprobe.server.engine.hf import TransformersEngine

MODEL = "preset:llama-3-8b-instruct"


def token_prompt(n: int, seed: int = 0, vocab: int = 1000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, vocab) for _ in range(n)]


async def _one(eng: TransformersEngine, ids: list[int], n: int) -> dict[str, Any]:
    g = eng.generate(GenParams(prompt_token_ids=ids, max_tokens=n, ignore_eos=True))
    await g.collect()
    t = g.timing
    return {
        "server_ttft_ms": round(t.queue + t.tokenize + t.prefill, 3),
        "queue_ms": round(t.queue, 3),
        "prefill_ms": round(t.prefill, 3),
        "ttft_ms": round(t.first_token_at - t.arrival, 3),
        "decode_ms_per_token": round(t.decode_steps / max(1, n - 1), 3),
        "path": t.prefill_path,
    }


async def _burst(eng: TransformersEngine, ids: list[int], k: int, n: int) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(_one(eng, ids, n) for _ in range(k))))


def ttft(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    opts = {
        "cuda_graphs": "1",
        "static_max_len": "2048",
        "graph_warm": str(args.graph_warm),
        "gc_freeze": str(args.gc_freeze),
    }
    batch = 32
    if args.compile:  # torch.compile'd decode step under the graphs: batch 1, widths 64-256 only
        opts.update(compile="1", static_max_len="256")
        batch = 1
    if args.small:
        opts = {"static_cache": "1", "static_max_len": "256"}
    eng = TransformersEngine(EngineConfig(model=args.model, device=args.device, max_batch_size=batch, options=opts))
    asyncio.run(eng.start())
    res: dict[str, Any] = {
        "graph_warm": args.graph_warm,
        "startup_ms": {p.name: round(p.ms, 1) for p in eng.startup.ordered()},
        "startup_notes": {p.name: p.note for p in eng.startup.ordered() if p.note},
    }
    ids = token_prompt(64)

    async def seq() -> None:
        res["fresh_singles"] = [await _one(eng, ids, 64) for _ in range(5)]
        if args.compile:
            return
        res["burst32"] = await _burst(eng, ids, 32, 8)
        res["singles_after_burst"] = [await _one(eng, ids, 64) for _ in range(20)]

    pauses: list[tuple[int, float]] = []  # (generation, ms) of every collection during the requests
    began: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began.append(time.perf_counter())
        elif began:
            pauses.append((int(info["generation"]), round((time.perf_counter() - began.pop()) * 1000, 3)))

    gc.callbacks.append(on_gc)
    asyncio.run(seq())
    gc.callbacks.remove(on_gc)
    res["gc_pauses"] = {
        f"gen{g}": {"count": len(ms), "max_ms": max(ms), "total_ms": round(sum(ms), 2)}
        for g in (0, 1, 2)
        if (ms := [m for gen, m in pauses if gen == g])
    }
    print("gc", res["gc_pauses"], flush=True)
    if args.compile:
        print("compiled", res["startup_ms"], res["fresh_singles"], flush=True)
        asyncio.run(eng.stop())
        return res
    for key in ("fresh_singles", "singles_after_burst"):
        print(key, [r["server_ttft_ms"] for r in res[key]], [r["path"] for r in res[key][:3]], flush=True)
    print("burst paths", sorted({r["path"] for r in res["burst32"]}), flush=True)
    # first vs later replays of prefill graphs no request used (a 64-token prompt uses bucket 64)
    static = eng._static
    assert static is not None
    replays: dict[str, list[float]] = {}
    for n in (128, 256, 512):
        if n not in static.p_graphs:
            continue
        graph, _ = static.p_graphs[n]
        times = []
        for _ in range(4):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graph.replay()
            torch.cuda.synchronize()
            times.append(round((time.perf_counter() - t0) * 1000, 3))
        replays[f"prefill_graph_{n}"] = times
    res["replays_ms"] = replays
    print("replays", replays, flush=True)
    asyncio.run(eng.stop())
    return res


def _greedy(model: Any, kw: str, ids: Any, n: int) -> Any:
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache})
    toks = [out.logits[:, -1, :].argmax(-1)]
    for _ in range(n - 1):
        out = model(input_ids=toks[-1][:, None], use_cache=True, logits_to_keep=1, **{kw: cache})
        toks.append(out.logits[:, -1, :].argmax(-1))
    return torch.stack(toks, dim=1)


def _forced(model: Any, seq: Any, prompt_len: int) -> Any:
    """Top-1 predictions for each generated position, given bf16's sequence (teacher-forced)."""
    logits = model(input_ids=seq, use_cache=False).logits
    return logits[:, prompt_len - 1 : -1, :].argmax(-1)


def _shapes(model: Any, kw: str) -> list[dict[str, Any]]:
    """An eager batched prefill (the engine's path for more newcomers than prefill_max_batch), each
    shape twice in a row: what a shape's first call costs, with torch's SDPA backends as they are
    and with the cuDNN attention backend off."""
    import torch
    from transformers import DynamicCache

    out = []
    for cudnn in (True, False):
        torch.backends.cuda.enable_cudnn_sdp(cudnn)
        for b, w in ((8, 64), (8, 72) if cudnn else (8, 88), (16, 64) if cudnn else (16, 80)):
            ids = torch.randint(10, 1000, (b, w), device="cuda")
            mask = torch.ones((b, w), dtype=torch.long, device="cuda")
            mask[0, :5] = 0  # left padding in one row, as the engine's batches have
            times = []
            for _ in range(3):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                with torch.inference_mode():
                    model(
                        input_ids=ids,
                        attention_mask=mask,
                        use_cache=True,
                        logits_to_keep=1,
                        **{kw: DynamicCache(config=model.config)},
                    )
                torch.cuda.synchronize()
                times.append(round((time.perf_counter() - t0) * 1000, 2))
            out.append({"cudnn_sdp": cudnn, "batch": b, "width": w, "ms": times})
            print("shape", out[-1], flush=True)
    torch.backends.cuda.enable_cudnn_sdp(True)
    return out


def quant(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from pathprobe.server.engine.quant import quantize

    eng = TransformersEngine(EngineConfig(model=MODEL, device="cuda", max_batch_size=8))
    asyncio.run(eng.start())
    bf16 = eng.model
    kw = eng._cache_kw
    n_prompts, plen, n_new = 8, 64, 64
    ids = torch.tensor([token_prompt(plen, seed=s) for s in range(n_prompts)], device="cuda")
    res: dict[str, Any] = {"prompts": n_prompts, "prompt_tokens": plen, "new_tokens": n_new, "rows": {}}
    with torch.no_grad():  # not inference_mode: its tensors would reach the quantized copies
        ref = _greedy(bf16, kw, ids, n_new)
        seq = torch.cat([ids, ref], dim=1)
        models = {"bf16": bf16}
        for kind in ("int8", "int4"):
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            q = copy.deepcopy(bf16)
            torch.cuda.synchronize()
            mid = torch.cuda.memory_allocated()
            try:
                note = quantize(q, kind, "cuda")
            except Exception as exc:  # report, go on with the other kind
                res["rows"][kind] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
                del q
                torch.cuda.empty_cache()
                continue
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            res["rows"][kind] = {
                "note": note,
                "copy_bytes": mid - before,
                "quantized_bytes": torch.cuda.memory_allocated() - before,
            }
            models[kind] = q
        full = bf16(input_ids=seq, use_cache=False).logits.float()
        for name, m in models.items():
            row = res["rows"].setdefault(name, {})
            # how far the logits moved (teacher-forced, every position): relative L2 error, cosine
            got = m(input_ids=seq, use_cache=False).logits.float()
            row["logits_rel_l2"] = round(float((got - full).norm() / full.norm()), 4)
            row["logits_cosine"] = round(float(torch.nn.functional.cosine_similarity(got, full, dim=-1).mean()), 4)
            row["logits_std"] = round(float(got.std()), 4)
            forced = _forced(m, seq, plen)
            row["teacher_forced_top1_agreement"] = round(float((forced == ref).float().mean()), 4)
            free = ref if name == "bf16" else _greedy(m, kw, ids, n_new)
            diff = [(free[i] != ref[i]).nonzero() for i in range(n_prompts)]
            first = [int(d[0]) if d.numel() else n_new for d in diff]
            row["free_running_first_difference"] = first
            row["free_running_token_agreement"] = round(float((free == ref).float().mean()), 4)
            # eager decode, batch 1, ms/token (no graphs): a rough speed signal beside the served one
            one = ids[:1]
            _greedy(m, kw, one, 4)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            _greedy(m, kw, one, 32)
            torch.cuda.synchronize()
            row["eager_ms_per_token_b1"] = round((time.perf_counter() - t0) * 1000 / 32, 3)
            print(name, json.dumps(row), flush=True)
    res["bf16_parameter_bytes"] = sum(p.numel() * p.element_size() for p in bf16.parameters())
    res["eager_prefill_shapes"] = _shapes(bf16, kw)
    asyncio.run(eng.stop())
    return res


def serve(args: argparse.Namespace) -> dict[str, Any]:
    """``pathprobe serve`` with ``--serve-args``; 20 sequential gRPC streams (64-token prompt, 64 new)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu_study  # the study's server wrapper and client

    logs = Path(tempfile.mkdtemp(prefix="pp-serve-"))
    srv = gpu_study.Serve(MODEL, *args.serve_args.split(), device="cuda", log_dir=logs)
    try:
        ids = token_prompt(64)
        rows = [gpu_study.grpc_stream(srv, prompt_token_ids=ids, max_tokens=64, ignore_eos=True) for _ in range(20)]
        startup = srv.startup()
    finally:
        srv.stop()
    out = [
        {
            "ttft_ms": round(r["ttft"], 3),
            "server_ttft_ms": round(r["entries"].get("srv.queue", 0) + r["entries"].get("srv.prefill", 0), 3),
            "decode_ms_per_token": round(r["entries"].get("srv.decode_steps", 0) / (r["tokens"] - 1), 3),
        }
        for r in rows
    ]
    print("serve", args.serve_args, startup, [o["decode_ms_per_token"] for o in out], flush=True)
    return {"serve_args": args.serve_args, "ready_s": srv.ready_s, "startup_ms": startup, "streams": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", choices=("ttft", "quant", "serve"))
    ap.add_argument("--serve-args", default="", help="serve: pathprobe serve options")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--graph-warm", type=int, default=1)
    ap.add_argument("--gc-freeze", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help="ttft: batch 1 with compile=1 (decode speed)")
    ap.add_argument("--small", action="store_true", help="ttft on the CPU with the @tiny preset (a check)")
    args = ap.parse_args()
    args.model, args.device = (MODEL + "@tiny", "cpu") if args.small else (MODEL, "cuda")
    import torch

    t0 = time.monotonic()
    res = {"ttft": ttft, "quant": quant, "serve": serve}[args.probe](args)
    res["card"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    res["versions"] = {"torch": torch.__version__, "transformers": __import__("transformers").__version__}
    res["wall_s"] = round(time.monotonic() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print("wrote", args.out, "median singles", _median(res), flush=True)
    return 0


def _median(res: dict[str, Any]) -> Any:
    rows = res.get("singles_after_burst")
    return statistics.median(r["server_ttft_ms"] for r in rows) if rows else None


if __name__ == "__main__":
    sys.exit(main())
