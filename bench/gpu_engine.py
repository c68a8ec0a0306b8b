"""The transformers engine on a GPU: TTFT and per-token decode time at several batch sizes.

Measures, in one run, side by side:

- the engine (``TransformersEngine``: worker thread, continuous batching, streaming):
  time to first token for one request, and per-token decode time / tokens per second
  with 1, 8 and 32 concurrent requests;
- the bare model's decode step at the same batch sizes, eager (DynamicCache), so the
  engine's own overhead per step shows as a ratio;
- the same decode step with a StaticCache captured once as a CUDA graph and replayed
  (what a static-cache / CUDA-graph decode path could reach; not an engine option yet).

Random weights (``preset:NAME`` builds the published architecture), so only the
timings mean anything. Writes ``docs/results/<date>-gpu-engine.md`` (or ``--out``).

    PYTHONPATH=src python3 bench/gpu_engine.py --model preset:llama-3-8b --dtype bf16
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pathprobe.engine.base import EngineConfig, GenParams
from pathprobe.engine.hf import TransformersEngine
from pathprobe.timing import now_ms

PROMPT = "The capital of France is"


def fixed_prompt_ids(tok, n: int) -> list[int]:
    base = tok.encode(PROMPT)
    filler = tok.encode(" and the river runs through the old city", add_special_tokens=False)
    ids = list(base)
    while len(ids) < n:
        ids.extend(filler)
    return ids[:n]


def device_info() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    info = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "cuda": str(torch.version.cuda),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu",
    }
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0:
            info["nvidia-smi"] = out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


async def engine_ttft(eng: TransformersEngine, ids: list[int], reps: int) -> dict[str, float]:
    ttft, prefill, queue = [], [], []
    for _ in range(reps):
        t0 = now_ms()
        g = eng.generate(GenParams(prompt_token_ids=ids, max_tokens=2, ignore_eos=True))
        first = None
        async for _ev in g:
            if first is None:
                first = now_ms() - t0
        ttft.append(first)
        prefill.append(g.timing.prefill)
        queue.append(g.timing.queue)
    return {"ttft_ms": statistics.median(ttft), "prefill_ms": statistics.median(prefill),
            "queue_ms": statistics.median(queue)}


async def engine_batch(eng: TransformersEngine, ids: list[int], batch: int, tokens: int, reps: int) -> dict[str, float]:
    per_tok, tps, queue = [], [], []
    for _ in range(reps):
        t0 = now_ms()
        gens = [eng.generate(GenParams(prompt_token_ids=ids, max_tokens=tokens, ignore_eos=True)) for _ in range(batch)]
        await asyncio.gather(*(g.collect() for g in gens))
        wall = now_ms() - t0
        per_tok.append(statistics.median(g.timing.decode_steps / (tokens - 1) for g in gens))
        tps.append(batch * tokens / (wall / 1000.0))
        queue.append(max(g.timing.queue for g in gens))
        assert max(g.timing.batch_size for g in gens) == batch, [g.timing.batch_size for g in gens]
    return {"decode_ms_per_token": statistics.median(per_tok), "tokens_per_s": statistics.median(tps),
            "max_queue_ms": statistics.median(queue)}


def raw_eager_step(model, batch: int, prompt_len: int, steps: int, device: str) -> float:
    """Median ms of one bare decode step (DynamicCache), no engine around it."""
    import torch
    from transformers import DynamicCache

    kw = "cache" if "cache" in __import__("inspect").signature(model.forward).parameters else "past_key_values"
    ids = torch.randint(10, 1000, (batch, prompt_len), device=device)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache})
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        times = []
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model(input_ids=nxt, use_cache=True, logits_to_keep=1, **{kw: cache})
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            nxt.tolist()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[2:])


def graph_step(model, batch: int, prompt_len: int, steps: int, device: str) -> float:
    """Median ms of one decode step with a StaticCache, captured as a CUDA graph and replayed."""
    import inspect

    import torch
    from transformers import StaticCache

    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    max_len = prompt_len + steps + 8
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    ids = torch.randint(10, 1000, (batch, prompt_len), device=device)
    with torch.inference_mode():
        model(input_ids=ids, cache_position=torch.arange(prompt_len, device=device), use_cache=True,
              logits_to_keep=1, **{kw: cache})
        s_ids = torch.full((batch, 1), 11, dtype=torch.long, device=device)
        s_cp = torch.tensor([prompt_len], device=device)
        s_pos = torch.full((batch, 1), prompt_len, dtype=torch.long, device=device)

        def step():
            return model(input_ids=s_ids, position_ids=s_pos, cache_position=s_cp, use_cache=True,
                         logits_to_keep=1, **{kw: cache}).logits

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            s_logits = step()
        times = []
        for k in range(steps):
            s_cp.fill_(prompt_len + k)
            s_pos.fill_(prompt_len + k)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graph.replay()
            nxt = s_logits[:, -1].argmax(-1, keepdim=True)
            s_ids.copy_(nxt)
            nxt.tolist()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[2:])


async def main_async(args: argparse.Namespace) -> dict:
    batches = [int(b) for b in args.batches.split(",")]
    cfg = EngineConfig(model=args.model, device=args.device, dtype=args.dtype, max_batch_size=max(batches),
                       max_wait_ms=args.max_wait_ms, max_queue=4 * max(batches))
    t0 = time.perf_counter()
    eng = TransformersEngine(cfg)
    await eng.start()
    load_s = time.perf_counter() - t0
    print(f"engine up in {load_s:.1f}s on {eng.device} {eng.dtype}", flush=True)
    ids = fixed_prompt_ids(eng.tokenizer, args.prompt_tokens)
    # warm-up (kernels, allocator) at every batch size
    for b in batches:
        await engine_batch(eng, ids, b, 4, 1)
    res: dict = {"info": device_info(), "model": args.model, "dtype": str(eng.dtype), "load_s": load_s,
                 "prompt_tokens": len(ids), "new_tokens": args.tokens, "max_wait_ms": args.max_wait_ms, "batches": {}}
    res["ttft"] = await engine_ttft(eng, ids, args.reps * 3)
    print("ttft", res["ttft"], flush=True)
    cuda = eng.device.startswith("cuda")
    for b in batches:
        row = await engine_batch(eng, ids, b, args.tokens, args.reps)
        if cuda:
            row["raw_eager_step_ms"] = raw_eager_step(eng.model, b, len(ids), 20, eng.device)
            try:
                row["cuda_graph_step_ms"] = graph_step(eng.model, b, len(ids), 20, eng.device)
            except Exception as exc:  # noqa: BLE001 - report, keep the other figures
                row["cuda_graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
        res["batches"][b] = row
        print(b, row, flush=True)
    await eng.stop()
    return res


def to_markdown(res: dict) -> str:
    info = res["info"]
    lines = [
        f"# Transformers engine on GPU — {res['model']} ({res['dtype']}, random weights)",
        "",
        f"Date: {info['date']}. Device: {info['device']}"
        + (f" ({info['nvidia-smi']})" if "nvidia-smi" in info else "") + ".",
        f"Versions: python {info['python']}, torch {info['torch']} (CUDA {info['cuda']}), "
        f"transformers {info['transformers']}, tokenizers {info['tokenizers']}.",
        f"Prompt {res['prompt_tokens']} tokens, {res['new_tokens']} new tokens per request (ignore_eos), "
        f"greedy; engine load (random init on the device) {res['load_s']:.1f} s.",
        "Command: `PYTHONPATH=src python3 bench/gpu_engine.py --model " + res["model"] + "`",
        "",
        f"Time to first token, one request alone (generate() → first token in the consumer): "
        f"**{res['ttft']['ttft_ms']:.1f} ms** (engine prefill {res['ttft']['prefill_ms']:.1f} ms, "
        f"queue incl. the {res['max_wait_ms']:g} ms batching window {res['ttft']['queue_ms']:.1f} ms).",
        "",
        "| concurrent requests | engine ms/token (decode) | engine tok/s | bare eager step ms | engine / bare | CUDA-graph step ms | bare / graph |",
        "|---|---|---|---|---|---|---|",
    ]
    for b, row in res["batches"].items():
        eager = row.get("raw_eager_step_ms")
        graph = row.get("cuda_graph_step_ms")
        lines.append(
            f"| {b} | {row['decode_ms_per_token']:.2f} | {row['tokens_per_s']:.0f} | "
            + (f"{eager:.2f} | {row['decode_ms_per_token'] / eager:.2f}× | " if eager else "– | – | ")
            + (f"{graph:.2f} | {eager / graph:.2f}× |" if graph and eager else
               f"failed: {row.get('cuda_graph_error', '–')} | – |")
        )
    lines += [
        "",
        "Engine ms/token is each request's `srv.decode_steps` / (tokens − 1), median over requests and reps; "
        "it is the wall time of the batched decode forward + sampling per step, as the request saw it. "
        "Bare eager step: the same model, one decode forward + argmax + host sync, no engine. "
        "CUDA-graph step: StaticCache decode forward captured once with `torch.cuda.graph` and replayed "
        "(not wired into the engine yet).",
        "",
        "Raw figures:",
        "",
        "```json",
        json.dumps(res, indent=1, default=str),
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="preset:llama-3-8b")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-wait-ms", type=float, default=2.0,
                    help="batching window (a burst submitted at once lands in one prefill anyway)")
    ap.add_argument("--out", type=Path, default=Path("docs/results"))
    args = ap.parse_args()
    res = asyncio.run(main_async(args))
    md = to_markdown(res)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{dt.date.today().isoformat()}-gpu-engine.md"
    path.write_text(md)
    print(md)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
